#include "cli/launch.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

#include "untied/comm/file_store.h"
#include "untied/comm/inproc.h"
#include "untied/comm/mpi.h"
#include "untied/comm/watchdog.h"
#include "untied/core/check.h"

namespace untied::cli {

namespace {

// "42" -> 42; anything else (empty, a sign, trailing text, past int) is a problem naming the variable.
bool parse_count(const char* var, const char* value, int* out, Status* problem) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value, &end, 10);
  if (*value == '\0' || *end != '\0' || errno != 0 || v < 0 || v > INT32_MAX) {
    if (problem->ok())
      *problem = Status::invalid_argument(std::string(var) + "='" + value + "' is not a rank or a count: the launcher " +
                                          "sets it, or it is left over from another job's environment");
    return false;
  }
  *out = static_cast<int>(v);
  return true;
}

// Slurm's tasks per node, "2(x3),1": the count of node `node` (-1 where it cannot be read).
int tasks_on_node(const std::string& list, int node) {
  int index = 0;
  size_t at = 0;
  while (at < list.size()) {
    const size_t comma = list.find(',', at);
    const std::string item = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const int count = std::atoi(item.c_str());
    int repeat = 1;
    if (const size_t x = item.find("(x"); x != std::string::npos) repeat = std::atoi(item.c_str() + x + 2);
    if (count <= 0 || repeat <= 0) return -1;
    if (node < index + repeat) return count;
    index += repeat;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return -1;
}

// Letters, digits, '.', '-' and '_' of s; the rest as '_' (a job's name in a path).
std::string path_safe(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return s;
}

}  // namespace

LaunchInfo launch_info_from(const std::function<const char*(const char*)>& get) {
  LaunchInfo li;
  auto has = [&](const char* var) { return get(var) != nullptr; };
  // Reads `var` into *out when it is set (the source names it); false when unset or not a number.
  auto read = [&](const char* var, int* out) {
    const char* v = get(var);
    if (v == nullptr) return false;
    li.source += std::string(li.source.empty() ? "" : " ") + var + "=" + v;
    return parse_count(var, v, out, &li.problem);
  };
  // UNTIED_LAUNCHER names the launcher whose variables to read where several are set (srun
  // inside an MPI job's environment, torchrun under srun); by default the first found of MPI's,
  // torchrun's, an srun step's.
  const std::string forced = has("UNTIED_LAUNCHER") ? get("UNTIED_LAUNCHER") : "";
  if (!forced.empty() && forced != "mpi" && forced != "slurm" && forced != "torchrun" && forced != "none") {
    li.problem = Status::invalid_argument("UNTIED_LAUNCHER='" + forced + "': use mpi, slurm, torchrun or none");
    li.launched = true;
    return li;
  }
  if (forced == "none") return li;
  const bool mpi = forced.empty() ? has("OMPI_COMM_WORLD_SIZE") || has("PMI_SIZE") || has("PMIX_RANK") : forced == "mpi";
  const bool torchrun = forced.empty() ? has("RANK") && has("WORLD_SIZE") : forced == "torchrun";
  const bool slurm = forced.empty() ? has("SLURM_PROCID") && has("SLURM_STEP_ID") : forced == "slurm";
  if (mpi) {
    li.launcher = Launcher::kMpi;
    li.mpi = li.launched = true;
    for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
      if (has(var)) {
        read(var, &li.world_rank);
        break;
      }
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
      if (has(var)) {
        read(var, &li.world_size);
        break;
      }
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
      if (has(var)) {
        read(var, &li.local_rank);
        break;
      }
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
      if (has(var)) {
        read(var, &li.local_size);
        break;
      }
    if (li.local_size == 1 && has("SLURM_NTASKS_PER_NODE")) li.local_size = std::max(1, std::atoi(get("SLURM_NTASKS_PER_NODE")));
    li.problem = Status::ok_status();  // MPI's own figures come from MPI_Init; these only guide threads and GPUs
    return li;
  }
  if ((torchrun && !(has("RANK") && has("WORLD_SIZE"))) || (slurm && !(has("SLURM_PROCID") && has("SLURM_NTASKS")))) {
    li.problem = Status::invalid_argument("UNTIED_LAUNCHER=" + forced + ", but " +
                                          (torchrun ? "RANK and WORLD_SIZE are" : "SLURM_PROCID and SLURM_NTASKS are") +
                                          " not both set: start the ranks with that launcher, or unset UNTIED_LAUNCHER");
    li.launched = true;
    return li;
  }
  if (torchrun) {  // torchrun and launchers like it
    li.launcher = Launcher::kTorchrun;
    read("RANK", &li.world_rank);
    read("WORLD_SIZE", &li.world_size);
    read("LOCAL_RANK", &li.local_rank);
    if (!read("LOCAL_WORLD_SIZE", &li.local_size)) li.local_size = li.local_rank >= 0 ? -1 : 1;
    if (li.local_size > 0 && li.local_size == li.world_size) li.nodes = 1;
    auto or_else = [&](const char* var, const char* fallback) { return std::string(has(var) ? get(var) : fallback); };
    li.job = path_safe("torchrun-" + or_else("TORCHELASTIC_RUN_ID", "none") + "-" + or_else("MASTER_ADDR", "local") +
                       "-" + or_else("MASTER_PORT", "0") + "-" + or_else("TORCHELASTIC_RESTART_COUNT", "0"));
  } else if (slurm) {  // an srun task (a batch script has no step id)
    li.launcher = Launcher::kSlurm;
    read("SLURM_PROCID", &li.world_rank);
    if (!read("SLURM_STEP_NUM_TASKS", &li.world_size)) read("SLURM_NTASKS", &li.world_size);
    read("SLURM_LOCALID", &li.local_rank);
    if (!read("SLURM_STEP_NUM_NODES", &li.nodes)) read("SLURM_NNODES", &li.nodes);
    int node = 0;
    const char* per_node = has("SLURM_STEP_TASKS_PER_NODE") ? get("SLURM_STEP_TASKS_PER_NODE") : get("SLURM_TASKS_PER_NODE");
    if (per_node != nullptr && (!has("SLURM_NODEID") || read("SLURM_NODEID", &node)))
      li.local_size = std::max(1, tasks_on_node(per_node, node));
    if (li.nodes == 1) li.local_size = li.world_size;
    li.job = path_safe("slurm-" + std::string(has("SLURM_JOB_ID") ? get("SLURM_JOB_ID") : "0") + "." +
                       (has("SLURM_STEP_ID") ? get("SLURM_STEP_ID") : "0"));
  } else {
    return li;  // one process: in-process ranks
  }
  if (li.problem.ok() && li.world_size < 1)
    li.problem = Status::invalid_argument("the world size is 0 (" + li.source + "): the launcher must start at least one rank");
  if (li.problem.ok() && li.world_rank >= li.world_size)
    li.problem = Status::invalid_argument("rank " + std::to_string(li.world_rank) + " is outside a world of " +
                                          std::to_string(li.world_size) + " (" + li.source +
                                          "): every rank must be told the same world size");
  if (li.problem.ok() && li.local_size > 0 && li.local_rank >= li.local_size)
    li.problem = Status::invalid_argument("local rank " + std::to_string(li.local_rank) + " is outside the " +
                                          std::to_string(li.local_size) + " ranks of its node (" + li.source + ")");
  if (li.local_size < 0) li.local_size = 1;
  li.launched = li.world_size > 1 || !li.problem.ok();
  return li;
}

LaunchInfo launch_info() {
  return launch_info_from([](const char* var) { return static_cast<const char*>(std::getenv(var)); });
}

int local_ranks_launched() { return std::max(1, launch_info().local_size); }

int local_rank_launched() { return launch_info().local_rank; }

StatusOr<int> gpu_for_local_rank(int local_rank, int visible) {
  if (visible == 1) return 0;
  if (local_rank < 0)
    return Status::invalid_argument("the launcher does not say this rank's local rank (LOCAL_RANK, SLURM_LOCALID), "
                                    "so its GPU of the " + std::to_string(visible) + " visible is unknown: give each "
                                    "rank one GPU (srun --gpus-per-task=1) or use a launcher that sets it");
  if (local_rank >= visible)
    return Status::invalid_argument("local rank " + std::to_string(local_rank) + " has no GPU of its own: " +
                                    std::to_string(visible) + " visible on this node; run at most " +
                                    std::to_string(visible) + " ranks per node");
  return local_rank;
}

StatusOr<std::string> rendezvous_dir(const LaunchInfo& li, const char* env_dir) {
  if (env_dir != nullptr && *env_dir != '\0') return std::string(env_dir) + "/" + li.job;
  if (li.nodes == 1 || (li.local_size > 1 && li.local_size == li.world_size))
    return "/tmp/untied-rendezvous-" + li.job;
  return Status::invalid_argument(
      "a job on several nodes started without MPI (" + li.source + ") needs UNTIED_RENDEZVOUS_DIR: a directory "
      "every node reaches (a shared filesystem, e.g. beside the checkpoints), where its ranks meet");
}

int default_threads_per_rank(int ranks_here) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_here));
}

namespace {
// Thrown on every rank at once by check_all_ranks; already reported.
struct RefusedOnAllRanks {};
}  // namespace

void check_all_ranks(Communicator& comm, const Status& s) {
  const Status first = first_failure(comm, s);
  if (first.ok()) return;
  if (comm.rank() == 0) {
    std::fprintf(stderr, "untied: %s\n", first.message().c_str());
    std::fflush(stderr);
  }
  throw RefusedOnAllRanks{};
}

namespace {
double g_collective_timeout_s = 600;

bool g_verify_schedule = false;
}  // namespace

void set_collective_timeout(double seconds) { g_collective_timeout_s = seconds; }
double collective_timeout() { return g_collective_timeout_s; }
void set_verify_schedule(bool on) { g_verify_schedule = on; }
WatchdogOptions watchdog_options() {
  const char* env = std::getenv("UNTIED_VERIFY_SCHEDULE");
  return WatchdogOptions{.timeout_s = g_collective_timeout_s,
                         .verify_schedule = g_verify_schedule || (env != nullptr && std::string(env) == "1")};
}

namespace {

// The world of a job launched from the environment: its calls go through the rendezvous
// directory (the file store) until carry_world_over hands them to the ranks' NCCL communicator.
// abort() always ends the job through the file store (NCCL's abort calls its bootstrap's).
class LaunchedWorld final : public Communicator {
 public:
  explicit LaunchedWorld(std::unique_ptr<Communicator> store) : store_(std::move(store)), current_(store_.get()) {}
  int rank() const override { return store_->rank(); }
  int size() const override { return store_->size(); }
  std::string backend() const override { return current_.load()->backend(); }
  void bind_device(Device& dev) override { current_.load()->bind_device(dev); }
  std::unique_ptr<Communicator> split(int color, int key) override { return current_.load()->split(color, key); }
  void all_to_all(const void* send, void* recv, int64_t block_bytes) override {
    current_.load()->all_to_all(send, recv, block_bytes);
  }
  void all_gather(const void* send, void* recv, int64_t block_bytes) override {
    current_.load()->all_gather(send, recv, block_bytes);
  }
  void reduce_scatter(const void* send, void* recv, int64_t block_elems, DType dtype, ReduceOp op) override {
    current_.load()->reduce_scatter(send, recv, block_elems, dtype, op);
  }
  void all_reduce(const void* send, void* recv, int64_t elems, DType dtype, ReduceOp op) override {
    current_.load()->all_reduce(send, recv, elems, dtype, op);
  }
  void broadcast(void* buf, int64_t bytes, int root) override { current_.load()->broadcast(buf, bytes, root); }
  void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes, int src) override {
    current_.load()->sendrecv(send, send_bytes, dest, recv, recv_bytes, src);
  }
  std::unique_ptr<PendingExchange> sendrecv_start(const void* send, int64_t send_bytes, int dest, void* recv,
                                                  int64_t recv_bytes, int src) override {
    return current_.load()->sendrecv_start(send, send_bytes, dest, recv, recv_bytes, src);
  }
  std::unique_ptr<PendingExchange> all_to_all_start(const void* send, void* recv, int64_t block_bytes) override {
    return current_.load()->all_to_all_start(send, recv, block_bytes);
  }
  void barrier() override { current_.load()->barrier(); }
  void abort(int code) noexcept override { store_->abort(code); }
  std::string cancel_in_flight() noexcept override { return current_.load()->cancel_in_flight(); }

  // The calls go over `c` from now on (null: through the file store again).
  void carry_over(Communicator* c) { current_ = c != nullptr ? c : store_.get(); }

 private:
  std::unique_ptr<Communicator> store_;
  std::atomic<Communicator*> current_;  // read by the watchdog's thread too (cancel_in_flight)
};

LaunchedWorld* g_launched = nullptr;  // this process's world while run_ranks runs one launched from the environment

class CarriedOver final : public WorldTransport {
 public:
  CarriedOver(LaunchedWorld& world, Communicator& over) : world_(world) { world_.carry_over(&over); }
  ~CarriedOver() override { world_.carry_over(nullptr); }

 private:
  LaunchedWorld& world_;
};

// Seconds from UNTIED_RENDEZVOUS_TIMEOUT (300 when unset).
StatusOr<double> rendezvous_timeout() {
  const char* v = std::getenv("UNTIED_RENDEZVOUS_TIMEOUT");
  if (v == nullptr || *v == '\0') return 300.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (*end != '\0' || !(s > 0) || s > 1e6)
    return Status::invalid_argument(std::string("UNTIED_RENDEZVOUS_TIMEOUT='") + v +
                                    "': give the seconds a rank waits for the others, > 0");
  return s;
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

}  // namespace

std::unique_ptr<WorldTransport> carry_world_over(Communicator& device_comm) {
  if (g_launched == nullptr) return nullptr;
  return std::make_unique<CarriedOver>(*g_launched, device_comm);
}

bool world_from_environment() { return g_launched != nullptr; }

namespace {

// run_ranks for a job launched from the environment (srun without MPI, torchrun): one rank per
// process, met through the rendezvous directory.
int run_launched(const LaunchInfo& li, int inproc_ranks, const WatchdogOptions& watchdog,
                 const std::function<void(Communicator&)>& body) {
  const bool root = li.world_rank == 0;
  auto refuse = [&](const std::string& why, bool every_rank) {
    if (root || every_rank) std::fprintf(stderr, "untied: rank %d: %s\n", li.world_rank, why.c_str());
    return 2;
  };
  if (!li.problem.ok()) return refuse(li.problem.message(), true);
  if (inproc_ranks > 1)
    return refuse("--ranks " + std::to_string(inproc_ranks) + " runs ranks as threads of one process; started by " +
                  (li.launcher == Launcher::kSlurm ? "srun" : "a launcher") + " (" + li.source +
                  ") each process is one rank: drop --ranks", false);
  StatusOr<std::string> dir = rendezvous_dir(li, std::getenv("UNTIED_RENDEZVOUS_DIR"));
  if (!dir.ok()) return refuse(dir.status().message(), false);
  StatusOr<double> timeout = rendezvous_timeout();
  if (!timeout.ok()) return refuse(timeout.status().message(), false);
  auto store = join_file_store(FileStoreOptions{.dir = dir.value(),
                                                .rank = li.world_rank,
                                                .size = li.world_size,
                                                .timeout_s = timeout.value(),
                                                .note = "host " + host_name() + ", pid " + std::to_string(getpid()) +
                                                        ", " + li.source});
  if (!store.ok()) return refuse("rendezvous: " + store.status().message(), true);
  if (watchdog.timeout_s > 0) {
    const char* wd = std::getenv("UNTIED_WATCHDOG_DIR");
    set_watchdog_dir(wd != nullptr && *wd != '\0' ? std::string(wd) : dir.value() + "/watchdog");
  }
  LaunchedWorld world(std::move(store).value());
  g_launched = &world;
  int rc = 0;
  {
    const std::unique_ptr<Communicator> watched = watch(world, watchdog);
    try {
      body(*watched);
    } catch (const RefusedOnAllRanks&) {
      rc = 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "untied: error: %s\n", e.what());
      std::fflush(stderr);
      if (world.size() > 1) world.abort(1);  // ends this process; the launcher stops the others
      rc = 1;
    }
  }
  g_launched = nullptr;
  return rc;
}

}  // namespace

int run_ranks(int* argc, char*** argv, int inproc_ranks, const std::function<void(Communicator&)>& body) {
  const WatchdogOptions watchdog = watchdog_options();
  const LaunchInfo li = launch_info();
  if (li.launched && !li.mpi) return run_launched(li, inproc_ranks, watchdog, body);
  if (li.mpi && watchdog.timeout_s > 0) {
    // The processes of this job say where they are in one directory, so that a stuck one can name
    // the ranks that never reached its collective: UNTIED_WATCHDOG_DIR (one every node reaches),
    // else one per job under /tmp (the ranks of this node).
    const char* dir = std::getenv("UNTIED_WATCHDOG_DIR");
    std::string job;
    for (const char* var : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"})
      if (const char* v = std::getenv(var); v != nullptr && job.empty()) job = v;
    if (const char* step = std::getenv("SLURM_STEP_ID"); step != nullptr && !job.empty()) job += std::string(".") + step;
    if (dir != nullptr && *dir != '\0') set_watchdog_dir(dir);
    else if (!job.empty()) set_watchdog_dir("/tmp/untied-watchdog-" + job);
  }
  if (li.mpi) {
    MpiSession session(argc, argv);
    std::unique_ptr<Communicator> world = watch(session.world(), watchdog);
    try {
      body(*world);
    } catch (const RefusedOnAllRanks&) {
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "untied: error: %s\n", e.what());
      std::fflush(stderr);
      if (world->size() > 1) world->abort(1);  // stops every rank; does not return
      return 1;
    }
    return 0;
  }
  std::atomic<bool> refused{false};
  try {
    run_in_process(inproc_ranks, [&](Communicator& plain) {
      const std::unique_ptr<Communicator> comm = watch(plain, watchdog);
      try {
        body(*comm);
      } catch (const RefusedOnAllRanks&) {
        refused = true;  // every rank sets it; reported already
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "untied: error: %s\n", e.what());
    return 1;
  }
  return refused ? 2 : 0;
}

}  // namespace untied::cli
