// The metrics file and the progress line (metrics.h).
#include "untied/train/metrics.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "untied/core/file_io.h"

namespace untied {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Rewrites a metrics file keeping the lines of steps <= step (atomically: a temporary renamed
// over it); a missing file is fine (nothing to keep).
Status keep_lines_through(const std::string& path, int64_t step) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::ok_status();
  auto text = read_regular_file(path, int64_t{16} << 30, "the metrics file");
  if (!text.ok()) return text.status();
  std::istringstream in(text.value());
  std::stringstream kept;
  std::string line;
  while (std::getline(in, line)) {
    const Json j = Json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > step) continue;
    kept << line << "\n";
  }
  if (!write_file_atomically(path, kept.str())) return Status::io_error("cannot rewrite the metrics file " + path);
  return Status::ok_status();
}

std::string format_duration(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}

}  // namespace

void MetricsFile::Closer::operator()(std::FILE* f) const { std::fclose(f); }

StatusOr<MetricsFile> MetricsFile::open(const std::string& path, int64_t resume_step) {
  if (resume_step > 0) {
    Status s = keep_lines_through(path, resume_step);
    if (!s.ok()) return s;
  }
  MetricsFile m;
  m.path_ = path;
  m.file_.reset(std::fopen(path.c_str(), resume_step > 0 ? "a" : "w"));
  if (m.file_ == nullptr)
    return Status::io_error("cannot write the metrics file " + path + ": " + std::strerror(errno));
  return m;
}

Status MetricsFile::write(const Json& line) {
  if (file_ == nullptr || !error_.ok()) return error_;
  const std::string text = json_line(line) + "\n";
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), file_.get()) != text.size() || std::fflush(file_.get()) != 0)
    error_ = Status::io_error("cannot write the metrics file " + path_ + ": " +
                              (errno != 0 ? std::strerror(errno) : "write failed") +
                              " (free space there, or pass another --metrics)");
  return error_;
}

Status MetricsFile::close() {
  if (file_ == nullptr) return error_;
  std::FILE* f = file_.release();
  errno = 0;
  if (std::fclose(f) != 0 && error_.ok())
    error_ = Status::io_error("cannot write the metrics file " + path_ + ": " + std::strerror(errno));
  return error_;
}

Json metrics_line(const StepMetrics& m) {
  Json j;
  j["step"] = m.step;
  j["loss"] = as_printed("%.6f", m.loss);
  j["accuracy"] = m.accuracy >= 0 ? Json(as_printed("%f", m.accuracy)) : Json(nullptr);
  j["lr"] = as_printed("%.6g", m.lr);
  j["grad_norm"] = as_printed("%.6g", m.grad_norm);
  j["tokens_per_s_per_rank"] = as_printed("%.1f", m.tokens_per_s_per_rank);
  j["step_ms"] = as_printed("%.2f", m.step_s * 1e3);
  j["phase_ms"] = Json{{"data", as_printed("%.2f", m.data_s * 1e3)},
                       {"forward_backward", as_printed("%.2f", m.forward_backward_s * 1e3)},
                       {"optimizer", as_printed("%.2f", m.optimizer_s * 1e3)}};
  if (m.ops != nullptr) {  // rank 0's own time in each kernel op this step; the rest is communication and glue
    Json ops = Json::object();
    for (const auto& [name, sec] : m.ops->seconds) ops[std::string(name)] = as_printed("%.2f", sec * 1e3);
    j["op_ms"] = ops;
  }
  j["peak_bytes_by_tag"] = peak_bytes_by_tag(*m.mem);
  return j;
}

Progress::Progress(int64_t first_step, int64_t end, int64_t steps, bool on, std::string accuracy_name)
    : first_(first_step),
      end_(end),
      steps_(steps),
      on_(on),
      tty_(::isatty(2) != 0),
      accuracy_name_(std::move(accuracy_name)),
      t_begin_(now_s()) {}

void Progress::step_done(int64_t step, double loss, double accuracy, double tokens_per_s_per_rank) {
  const int64_t done = step - first_, total = end_ - first_;
  if (!on_ || !(tty_ || done == total || done % std::max<int64_t>(1, total / 20) == 0)) return;
  const double eta = (now_s() - t_begin_) / done * (total - done);
  const int width = 24, fill = static_cast<int>(width * step / steps_);
  std::fprintf(stderr, "%sstep %lld/%lld [%s%s] loss %.4f%s | %.0f tok/s/rank | ETA %s%s", tty_ ? "\r" : "",
               (long long)step, (long long)steps_, std::string(fill, '=').c_str(), std::string(width - fill, ' ').c_str(),
               loss, accuracy >= 0 ? (" | " + accuracy_name_ + " " + std::to_string(accuracy).substr(0, 5)).c_str() : "",
               tokens_per_s_per_rank, format_duration(eta).c_str(), tty_ && done != total ? "   " : "\n");
}

}  // namespace untied
