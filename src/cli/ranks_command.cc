// `untied ranks`: checks a launch before a long job is put on it. Every rank joins the world as
// the training would (mpirun; srun without MPI or torchrun through the rendezvous directory,
// launch.h), says where it runs and which GPU it would take, and the ranks agree on one NCCL
// unique id; rank 0 prints one line per rank. Exit status 0 when the ranks agree, 1 when they do
// not (two ranks on one GPU, different ids), 2 when the launch is refused.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "untied/comm/nccl.h"
#include "untied/device/cuda.h"

namespace untied::cli {
namespace {

// What a rank says of itself (all_gather'ed; plain bytes).
struct RankRecord {
  int32_t rank = 0, local_rank = -1, local_size = 1, gpu = -1, visible = 0;
  int64_t pid = 0;
  uint64_t id_hash = 0;  // FNV-1a of the NCCL unique id this rank holds (0: none)
  char host[64] = {};
  char gpu_note[120] = {};  // why no GPU ("" when gpu >= 0)
};

uint64_t fnv1a(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::kMpi: return "mpirun";
    case Launcher::kSlurm: return "srun (no MPI)";
    case Launcher::kTorchrun: return "torchrun-style environment";
    case Launcher::kNone: break;
  }
  return "one process";
}

}  // namespace

int ranks_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied ranks",
                "Checks a launch: every rank joins (mpirun; srun or torchrun without MPI through\n"
                "UNTIED_RENDEZVOUS_DIR), says its host, local rank and GPU, and the ranks agree on one NCCL id.\n"
                "Rank 0 prints a line per rank. Exit 0: the launch is sound for `untied train --device cuda`.");
  const LaunchInfo li = launch_info();
  if (auto exit = parse_command_line(flags, args, li.world_rank == 0)) return *exit;
  int verdict = 0;
  const int rc = run_ranks(argc, argv, 1, [&](Communicator& world) {
    RankRecord mine;
    mine.rank = world.rank();
    mine.local_rank = li.local_rank;
    mine.local_size = li.local_size;
    mine.pid = getpid();
    gethostname(mine.host, sizeof mine.host - 1);
    mine.visible = cuda_device_count();
    if (mine.visible > 0) {
      StatusOr<int> gpu = gpu_for_local_rank(li.local_rank >= 0 ? li.local_rank : world.rank(), mine.visible);
      if (gpu.ok()) mine.gpu = gpu.value();
      else std::snprintf(mine.gpu_note, sizeof mine.gpu_note, "%s", gpu.status().message().c_str());
    } else {
      std::snprintf(mine.gpu_note, sizeof mine.gpu_note, "no GPU visible");
    }
    // The NCCL id: each rank's own where NCCL_COMM_ID names the root's address (all the same by
    // construction), else rank 0's handed to the others, as make_nccl_communicator does.
    std::string id(128, '\0');
    Status idst;
    const bool from_env = std::getenv("NCCL_COMM_ID") != nullptr;
    if (nccl_built() && (from_env || world.rank() == 0)) {
      StatusOr<std::string> made = nccl_unique_id();
      if (made.ok()) id = made.value();
      else idst = made.status();
    }
    check_all_ranks(world, idst);
    if (nccl_built()) {
      if (!from_env) world.broadcast(id.data(), static_cast<int64_t>(id.size()), 0);
      mine.id_hash = fnv1a(id);
    }
    std::vector<RankRecord> all(static_cast<size_t>(world.size()));
    world.all_gather(&mine, all.data(), sizeof mine);
    if (world.rank() != 0) return;
    std::printf("%d ranks (%s, %s backend)%s\n", world.size(), launcher_name(li.launcher), world.backend().c_str(),
                li.source.empty() ? "" : ("; from " + li.source.substr(0, li.source.find(' '))).c_str());
    std::printf("%-5s %-20s %-8s %-6s %-12s %s\n", "rank", "host", "pid", "local", "GPU", "NCCL id");
    std::string problems;
    for (const RankRecord& r : all) {
      const std::string local = r.local_rank >= 0 ? std::to_string(r.local_rank) + "/" + std::to_string(r.local_size) : "-";
      const std::string gpu = r.gpu >= 0 ? std::to_string(r.gpu) + " of " + std::to_string(r.visible) : "-";
      char hash[24] = "-";
      if (r.id_hash != 0) std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(r.id_hash));
      std::printf("%-5d %-20s %-8lld %-6s %-12s %s%s%s\n", r.rank, r.host, static_cast<long long>(r.pid),
                  local.c_str(), gpu.c_str(), hash, r.gpu_note[0] != '\0' ? "  " : "", r.gpu_note);
      if (r.id_hash != all[0].id_hash)
        problems += "rank " + std::to_string(r.rank) + " holds another NCCL id than rank 0; ";
      for (const RankRecord& q : all)
        if (q.rank < r.rank && r.gpu >= 0 && q.gpu == r.gpu && std::strcmp(q.host, r.host) == 0 && r.visible > 1)
          problems += "ranks " + std::to_string(q.rank) + " and " + std::to_string(r.rank) + " would share GPU " +
                      std::to_string(r.gpu) + " of " + r.host + "; ";
    }
    if (!problems.empty()) {
      std::fprintf(stderr, "untied ranks: %s\n", problems.substr(0, problems.size() - 2).c_str());
      verdict = 1;
      return;
    }
    std::printf("%s\n", nccl_built() ? "every rank holds the same NCCL id" : "this build has no NCCL: ids not checked");
  });
  return rc != 0 ? rc : verdict;
}

}  // namespace untied::cli
