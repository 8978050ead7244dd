// `untied export`: an untied checkpoint as a Hugging Face model directory that transformers
// loads (hf_weights.h: export_checkpoint).
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "untied/train/hf_weights.h"

namespace untied::cli {

int export_main(int*, char***, const std::vector<std::string>& args) {
  FlagSet flags("untied export",
                "Writes the newest checkpoint of an untied run (any rank count) as a Hugging Face directory:\n"
                "config.json and model.safetensors, which transformers loads unchanged. One process.");
  flags.add("checkpoint-dir", FlagKind::kString, "", "the run's --checkpoint-dir");
  flags.add("out", FlagKind::kString, "", "the Hugging Face directory to write");
  flags.add_checked("dtype", "bf16", "tensor storage: bf16 (as published models are), f32 or f16",
                    [](const std::string& v) { return parse_hf_dtype(v).status(); });
  if (auto exit = parse_command_line(flags, args, /*root=*/true)) return *exit;
  if (flags.get_string("checkpoint-dir").empty() || flags.get_string("out").empty())
    return refuse(flags, Status::invalid_argument("--checkpoint-dir and --out are both needed"));
  auto dtype = parse_hf_dtype(flags.get_string("dtype"));
  Status st = export_checkpoint(flags.get_string("checkpoint-dir"), flags.get_string("out"), dtype.value());
  if (!st.ok()) {
    std::fprintf(stderr, "untied export: %s\n", st.message().c_str());
    return st.code() == Status::Code::kInvalidArgument || st.code() == Status::Code::kNotFound ? 2 : 1;
  }
  std::printf("wrote %s/config.json and %s/model.safetensors (%s)\n", flags.get_string("out").c_str(),
              flags.get_string("out").c_str(), dtype.value().c_str());
  return 0;
}

}  // namespace untied::cli
