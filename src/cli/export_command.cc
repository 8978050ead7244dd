// `untied export`: an untied checkpoint as a Hugging Face model directory that transformers
// loads (hf_weights.h: export_checkpoint).
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "untied/train/hf_weights.h"

namespace untied::cli {

int export_main(int*, char***, const std::vector<std::string>& args) {
  FlagSet flags("untied export",
                "Writes a checkpoint of an untied run (any rank count; the newest, or --step N) as a Hugging Face\n"
                "directory: config.json, model.safetensors and the source model's tokenizer files, which\n"
                "transformers loads unchanged. One process.");
  flags.add("checkpoint-dir", FlagKind::kString, "", "the run's --checkpoint-dir");
  flags.add("out", FlagKind::kString, "", "the Hugging Face directory to write");
  flags.add_checked("dtype", "auto",
                    "tensor storage: auto (the source model's dtype, f32 for a model made by untied), bf16, f32 or f16",
                    [](const std::string& v) { return v == "auto" ? Status::ok_status() : parse_hf_dtype(v).status(); });
  flags.add("step", FlagKind::kInt, "0", "the checkpoint's step to export (0: the newest, the one `latest` names)");
  if (auto exit = parse_command_line(flags, args, /*root=*/true)) return *exit;
  if (flags.get_string("checkpoint-dir").empty() || flags.get_string("out").empty())
    return refuse(flags, Status::invalid_argument("--checkpoint-dir and --out are both needed"));
  if (flags.get_int("step") < 0) return refuse(flags, Status::invalid_argument("--step must be 0 (the newest) or a step"));
  const std::string dtype =
      flags.get_string("dtype") == "auto" ? std::string() : parse_hf_dtype(flags.get_string("dtype")).value();
  ExportResult done;
  Status st = export_checkpoint(flags.get_string("checkpoint-dir"), flags.get_string("out"), dtype,
                                flags.get_int("step"), &done);
  if (!st.ok()) {
    std::fprintf(stderr, "untied export: %s\n", st.message().c_str());
    return st.code() == Status::Code::kInvalidArgument || st.code() == Status::Code::kNotFound ? 2 : 1;
  }
  std::string files;
  for (const std::string& f : done.tokenizer_files) files += ", " + f;
  std::printf("wrote step %lld to %s: config.json, model.safetensors (%s)%s\n", static_cast<long long>(done.step),
              flags.get_string("out").c_str(), done.dtype.c_str(),
              files.empty() ? " (no tokenizer files: the run had no --hf-model)" : files.c_str());
  return 0;
}

}  // namespace untied::cli
