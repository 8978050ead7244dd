#include "untied/train/needle.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "untied/core/check.h"

namespace untied {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The built-in haystack: plain English sentences, rotated per trial, repeated to any length.
constexpr const char* kFiller[] = {
    "The river bends twice before it reaches the old mill, where the water slows and turns green.",
    "Most of the town's bakers start work at four in the morning, long before the first bus arrives.",
    "A good map leaves out almost everything, and that is exactly what makes it useful.",
    "The library keeps its oldest books in a cold room that few visitors ever see.",
    "In spring the hills are covered with small yellow flowers that close again at dusk.",
    "Engineers often say that a bridge is designed for the storm it has not met yet.",
    "The market opens on Saturdays, and by noon the best apples are usually gone.",
    "Some birds return to the same tree every year, even after a long journey south.",
    "A clock that is stopped is still right twice a day, but nobody plans a meeting by it.",
    "The museum's new wing was built around an old courtyard instead of replacing it.",
    "Fishermen read the colour of the sky at dawn to guess how the sea will behave.",
    "Every winter the lake freezes from the edges inward, leaving a dark circle in the middle.",
};
constexpr int kFillerCount = sizeof(kFiller) / sizeof(kFiller[0]);

constexpr const char* kNames[] = {"amber",  "birch",  "cobalt", "dune",   "ember",  "fjord", "garnet", "harbor",
                                  "indigo", "juniper", "kestrel", "lagoon", "meadow", "nectar", "onyx",  "prairie"};
constexpr const char* kWords[] = {"lantern", "velvet", "orchard", "compass", "meteor", "glacier", "saffron", "walrus",
                                  "quartz",  "tundra", "mosaic",  "falcon",  "pepper", "violin",  "harvest", "canyon"};

std::vector<int32_t> filler_tokens(const NeedleTokenizer& tok, int64_t n, uint64_t trial) {
  std::vector<int32_t> out;
  for (int64_t s = static_cast<int64_t>(trial % kFillerCount); static_cast<int64_t>(out.size()) < n; ++s) {
    const std::vector<int32_t> ids = tok.encode(std::string(kFiller[s % kFillerCount]) + " ");
    out.insert(out.end(), ids.begin(), ids.end());
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

StatusOr<std::vector<NeedleSequence>> make_needle_cell(const NeedleTokenizer& tok, const DataSource* haystack,
                                                       const NeedleOptions& o, int64_t length, int64_t depth) {
  std::vector<NeedleSequence> out;
  for (int64_t t = 0; t < o.trials; ++t) {
    const uint64_t cell = mix(o.seed ^ mix(static_cast<uint64_t>(length) * 1000003u + static_cast<uint64_t>(depth)) ^
                              mix(static_cast<uint64_t>(t) + 77));
    // The keys and names of this trial's needles; needle 0 is the one asked.
    std::vector<std::string> keys, names;
    const uint64_t first_name = mix(cell ^ 0x6e616d65ull) % 16;
    for (int64_t k = 0; k < o.keys; ++k) {
      const uint64_t r = mix(cell + static_cast<uint64_t>(k));
      if (o.key_kind == "word") keys.push_back(kWords[(r >> 8) % 16]);
      else keys.push_back(std::to_string(1000000 + r % 9000000));
      names.push_back(kNames[(first_name + 5 * static_cast<uint64_t>(k)) % 16]);  // (5 and 16 coprime: distinct)
    }
    const auto about = [&](int64_t k) { return o.keys > 1 ? " for " + names[static_cast<size_t>(k)] : std::string(); };
    std::vector<std::vector<int32_t>> needles;
    int64_t needle_tokens = 0;
    for (int64_t k = 0; k < o.keys; ++k) {
      needles.push_back(tok.encode("\n\nThe special magic number" + about(k) + " is: " + keys[static_cast<size_t>(k)] +
                                   ".\n\n"));
      needle_tokens += static_cast<int64_t>(needles.back().size());
    }
    const std::string question = "\n\nWhat is the special magic number" + about(0) +
                                 "? The special magic number" + about(0) + " is: ";
    const std::vector<int32_t> q = tok.encode(question), tail = tok.encode(question + keys[0]);
    size_t common = 0;
    while (common < q.size() && common < tail.size() && q[common] == tail[common]) ++common;
    if (common == tail.size())
      return Status::invalid_argument("the needle's key has no tokens of its own after the question (tokenizer)");
    const int64_t fixed = (tok.bos ? 1 : 0) + needle_tokens + static_cast<int64_t>(tail.size());
    const int64_t hay = length - fixed;
    if (hay < 16)
      return Status::invalid_argument("--needle-lengths " + std::to_string(length) + " leaves " + std::to_string(hay) +
                                      " tokens of haystack beside the needles and the question (" +
                                      std::to_string(fixed) + " tokens): give longer lengths");
    std::vector<int32_t> h;
    if (haystack != nullptr) {
      h.resize(static_cast<size_t>(hay));
      std::vector<int32_t> labels(h.size());
      if (Status s = haystack->fill(t, hay, 0, hay, h.data(), labels.data(), nullptr); !s.ok()) return s;
    } else {
      h = filler_tokens(tok, hay, static_cast<uint64_t>(t));
    }
    // Insertion points in the haystack: the asked needle at the cell's depth, the others seeded.
    std::vector<std::pair<int64_t, int64_t>> at;  // (haystack position, needle)
    at.emplace_back(static_cast<int64_t>(std::llround(static_cast<double>(depth) / 100.0 * static_cast<double>(hay))), 0);
    for (int64_t k = 1; k < o.keys; ++k)
      at.emplace_back(static_cast<int64_t>(mix(cell ^ (0xabcdull + static_cast<uint64_t>(k))) % static_cast<uint64_t>(hay + 1)), k);
    std::stable_sort(at.begin(), at.end());
    NeedleSequence seq;
    seq.key = keys[0];
    seq.name = o.keys > 1 ? names[0] : "";
    if (tok.bos) seq.tokens.push_back(*tok.bos);
    int64_t from = 0;
    for (const auto& [pos, k] : at) {
      seq.tokens.insert(seq.tokens.end(), h.begin() + from, h.begin() + pos);
      if (k == 0) seq.needle_at = static_cast<int64_t>(seq.tokens.size());
      seq.tokens.insert(seq.tokens.end(), needles[static_cast<size_t>(k)].begin(), needles[static_cast<size_t>(k)].end());
      from = pos;
    }
    seq.tokens.insert(seq.tokens.end(), h.begin() + from, h.end());
    const int64_t tail_at = static_cast<int64_t>(seq.tokens.size());
    seq.tokens.insert(seq.tokens.end(), tail.begin(), tail.end());
    seq.answer_begin = tail_at + static_cast<int64_t>(common);
    seq.answer_end = static_cast<int64_t>(seq.tokens.size());
    UNTIED_CHECK(static_cast<int64_t>(seq.tokens.size()) == length, "needle sequence of ", seq.tokens.size(),
                 " tokens, not ", length);
    out.push_back(std::move(seq));
  }
  return out;
}

Status NeedleCellSource::fill(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens,
                              int32_t* labels, uint8_t* is_answer) const {
  const NeedleSequence& s = sequences_[static_cast<size_t>(sample_index) % sequences_.size()];
  UNTIED_CHECK(seq_len == static_cast<int64_t>(s.tokens.size()), "a needle sequence of ", s.tokens.size(),
               " tokens read at seq_len ", seq_len);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t p = start + k;
    tokens[k] = s.tokens[static_cast<size_t>(p)];
    const bool key = p + 1 >= s.answer_begin && p + 1 < s.answer_end;
    labels[k] = key ? s.tokens[static_cast<size_t>(p) + 1] : kIgnoreIndex;
    if (is_answer != nullptr) is_answer[k] = key ? 1 : 0;
  }
  return Status::ok_status();
}

Json needle_json(const std::vector<NeedleCell>& cells, const NeedleOptions& o, const std::string& label) {
  Json j;
  j["label"] = label;
  j["lengths"] = o.lengths;
  j["depths"] = o.depths;
  j["keys"] = o.keys;
  j["key_kind"] = o.key_kind;
  j["trials"] = o.trials;
  Json rows = Json::array();
  double sum = 0;
  for (const NeedleCell& c : cells) {
    rows.push_back(Json{{"length", c.length},     {"depth", c.depth},
                        {"accuracy", c.accuracy}, {"exact", c.exact},
                        {"loglik", c.loglik},     {"key_tokens", c.key_tokens}});
    sum += c.accuracy;
  }
  j["cells"] = rows;
  j["accuracy"] = cells.empty() ? 0.0 : sum / static_cast<double>(cells.size());
  return j;
}

std::string needle_svg(const std::vector<Json>& tables, const std::string& title) {
  const double cell_w = 56, cell_h = 22, left = 70, top = 66, gap = 60;
  std::string body;
  char buf[512];
  double x0 = left, width = 0, height = 0;
  for (const Json& t : tables) {
    const std::vector<int64_t> lengths = t.at("lengths").get<std::vector<int64_t>>();
    const std::vector<int64_t> depths = t.at("depths").get<std::vector<int64_t>>();
    std::map<std::pair<int64_t, int64_t>, double> acc;
    for (const Json& c : t.at("cells")) acc[{c.at("length").get<int64_t>(), c.at("depth").get<int64_t>()}] = c.at("accuracy").get<double>();
    std::string label = t.value("label", "");
    for (char& ch : label)
      if (ch == '<' || ch == '>' || ch == '&') ch = ' ';
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">%s (mean %.3f)</text>\n", x0, top - 24,
                  label.c_str(), t.value("accuracy", 0.0));
    body += buf;
    for (size_t r = 0; r < depths.size(); ++r) {
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%lld%%</text>\n", x0 - 6,
                    top + cell_h * (static_cast<double>(r) + 0.7), (long long)depths[r]);
      body += buf;
      for (size_t c = 0; c < lengths.size(); ++c) {
        const auto it = acc.find({lengths[c], depths[r]});
        const double a = it == acc.end() ? 0 : it->second;
        const int red = static_cast<int>(std::lround(220 * (1 - a) + 30 * a)), green = static_cast<int>(std::lround(60 * (1 - a) + 170 * a));
        std::snprintf(buf, sizeof buf,
                      "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"rgb(%d,%d,70)\" stroke=\"white\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"white\">%.2f</text>\n",
                      x0 + cell_w * static_cast<double>(c), top + cell_h * static_cast<double>(r), cell_w, cell_h, red, green,
                      x0 + cell_w * (static_cast<double>(c) + 0.5), top + cell_h * (static_cast<double>(r) + 0.7), a);
        body += buf;
      }
    }
    for (size_t c = 0; c < lengths.size(); ++c) {
      const int64_t l = lengths[c];
      const std::string name = l % 1024 == 0 && l >= 1024 ? std::to_string(l / 1024) + "K" : std::to_string(l);
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                    x0 + cell_w * (static_cast<double>(c) + 0.5), top + cell_h * static_cast<double>(depths.size()) + 16,
                    name.c_str());
      body += buf;
    }
    const double panel_w = cell_w * static_cast<double>(lengths.size());
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">context length (tokens)</text>\n",
                  x0 + panel_w / 2, top + cell_h * static_cast<double>(depths.size()) + 36);
    body += buf;
    x0 += panel_w + gap;
    width = x0;
    height = std::max(height, top + cell_h * static_cast<double>(depths.size()) + 50);
  }
  std::string svg;
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                "<text x=\"12\" y=\"20\" font-size=\"15\">",
                width, height);
  svg += buf;
  for (char ch : title) svg += ch == '<' ? std::string("&lt;") : ch == '&' ? std::string("&amp;") : std::string(1, ch);
  svg += "</text>\n<text x=\"16\" y=\"" + std::to_string(static_cast<int>(top + 40)) +
         "\" transform=\"rotate(-90 16 " + std::to_string(static_cast<int>(top + 40)) +
         ")\" text-anchor=\"middle\">needle depth</text>\n";
  svg += body + "</svg>\n";
  return svg;
}

}  // namespace untied
