// `lockstep report`: one self-contained HTML page about a run or a kit, and optionally its audit.
//
// The plots are plain inline SVG written here rather than a charting library inlined into the
// page: a few polylines with axes need no code in the browser, the page works offline and in
// any viewer (even with scripts disabled), and a test can check the plotted numbers in the DOM
// (every series carries its point count, every marker its step). Nothing in the page refers to
// anything outside it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/audit.h"
#include "lockstep/build_info.h"
#include "lockstep/json.h"
#include "lockstep/kit.h"
#include "lockstep/train.h"

namespace lockstep::audit {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

std::string Escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---- plots ------------------------------------------------------------------------------------
struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value), finite values only
  bool dashed = false;                            // --compare's run
};

struct PlotSpec {
  std::string id, title, y_label;
  std::vector<Series> series;
  std::vector<uint64_t> checkpoints;  // vertical dashed lines
  // Steps marked with a class ("skipped" or "clipped") and a label.
  std::vector<std::tuple<double, std::string, std::string>> marks;
  std::optional<std::pair<double, std::string>> threshold;  // a horizontal line (clip norm)
  bool log_y = false;
};

std::string Number(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  return a >= 1e4 || a < 1e-3 ? fmt::format("{:.2e}", v) : fmt::format("{:.4g}", v);
}

std::string Plot(const PlotSpec& p) {
  // The title on the first line, the series' legends on the second.
  constexpr double kW = 560, kH = 230, kLeft = 64, kRight = 12, kTop = 40, kBottom = 34;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  const auto y_of = [&](double v) { return p.log_y ? std::log10(v) : v; };
  for (const Series& s : p.series) {
    for (const auto& [x, y] : s.points) {
      if (p.log_y && y <= 0) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y_of(y)), y1 = std::max(y1, y_of(y));
    }
  }
  if (p.threshold && (!p.log_y || p.threshold->first > 0)) {
    y0 = std::min(y0, y_of(p.threshold->first)), y1 = std::max(y1, y_of(p.threshold->first));
  }
  for (const uint64_t c : p.checkpoints) {
    x0 = std::min(x0, static_cast<double>(c)), x1 = std::max(x1, static_cast<double>(c));
  }
  std::string svg = fmt::format(
      "<svg id=\"plot-{}\" class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
      "height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">"
      "<text x=\"{}\" y=\"16\" class=\"title\">{}</text>",
      p.id, kW, kH, kW, kH, Escape(p.title), kLeft, Escape(p.title));
  if (x0 > x1 || y0 > y1) {
    return svg + fmt::format("<text x=\"{}\" y=\"{}\">no data</text></svg>", kLeft, kH / 2);
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + (y0 == 0 ? 1 : std::fabs(y0) * 0.1);
  // Differences taken in halves, so that values near ±DBL_MAX (finite, however absurd) give a
  // finite range: every coordinate and tick stays a number.
  const auto half_span = [](double lo, double hi) { return hi / 2 - lo / 2; };
  const double pad = half_span(y0, y1) * 0.1, most = std::numeric_limits<double>::max();
  y0 = std::max(y0 - pad, -most), y1 = std::min(y1 + pad, most);
  const auto sx = [&](double x) {
    return kLeft + half_span(x0, x) / half_span(x0, x1) * (kW - kLeft - kRight);
  };
  const auto sy = [&](double y) {
    return kTop + half_span(y, y1) / half_span(y0, y1) * (kH - kTop - kBottom);
  };
  // Axes, with five ticks each.
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>", kLeft,
                     kTop, kW - kLeft - kRight, kH - kTop - kBottom);
  for (int t = 0; t <= 4; ++t) {
    const double xv = x0 + half_span(x0, x1) * t / 2, yv = y0 + half_span(y0, y1) * t / 2;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
                       sx(xv), kH - kBottom + 14, Number(std::round(xv)));
    svg += fmt::format(
        "<text x=\"{}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{}</text>"
        "<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" class=\"grid\"/>",
        kLeft - 4, sy(yv) + 4, Number(p.log_y ? std::pow(10.0, yv) : yv), kLeft, kW - kRight,
        sy(yv), sy(yv));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">step</text>",
                     (kLeft + kW - kRight) / 2, kH - 4);
  svg += fmt::format(
      "<text x=\"12\" y=\"{}\" class=\"tick\" transform=\"rotate(-90 12 {})\" "
      "text-anchor=\"middle\">{}</text>",
      kH / 2, kH / 2, Escape(p.y_label));
  for (const uint64_t c : p.checkpoints) {
    svg += fmt::format(
        "<line class=\"checkpoint\" data-step=\"{}\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" "
        "y2=\"{}\"><title>checkpoint step {}</title></line>",
        c, sx(static_cast<double>(c)), sx(static_cast<double>(c)), kTop, kH - kBottom, c);
  }
  if (p.threshold) {
    svg += fmt::format(
        "<line class=\"threshold\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"><title>{}</title>"
        "</line>",
        kLeft, kW - kRight, sy(y_of(p.threshold->first)), sy(y_of(p.threshold->first)),
        Escape(p.threshold->second));
  }
  // The legends in a row ending at the right, each as wide as its name.
  std::vector<double> legend_x(p.series.size());
  double right = kW - kRight;
  for (size_t i = p.series.size(); i-- > 0;) {
    right -= 6.5 * static_cast<double>(p.series[i].name.size()) + 12;
    legend_x[i] = right;
  }
  size_t legend = 0;
  for (const Series& s : p.series) {
    std::string points;
    size_t count = 0;
    for (const auto& [x, y] : s.points) {
      if (p.log_y && y <= 0) continue;
      points += fmt::format("{:.1f},{:.1f} ", sx(x), sy(y_of(y)));
      ++count;
    }
    svg += fmt::format(
        "<polyline class=\"series\" data-series=\"{}\" data-points=\"{}\" fill=\"none\" "
        "stroke=\"{}\" stroke-width=\"1.5\"{} points=\"{}\"/>",
        Escape(s.name), count, s.color, s.dashed ? " stroke-dasharray=\"5 3\"" : "", points);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"32\" class=\"legend\" fill=\"{}\">{}</text>",
                       legend_x[legend++], s.color, Escape(s.name));
  }
  for (const auto& [x, kind, label] : p.marks) {
    svg += fmt::format(
        "<circle class=\"mark {}\" data-step=\"{}\" cx=\"{:.1f}\" cy=\"{}\" r=\"3.5\"><title>step "
        "{}: {}</title></circle>",
        kind, x, sx(x), kind == "skipped" ? kTop + 6 : kTop + 14, x, Escape(label));
  }
  return svg + "</svg>";
}

// ---- what the page is made of ----------------------------------------------------------------
struct CheckpointRow {
  uint64_t step = 0;
  Digest state_hash{};
};

struct Source {
  std::string kind;  // "run" or "kit"
  std::string descriptor;
  std::vector<train::MetricsLine> metrics;
  std::vector<StateHashLine> chain;
  std::vector<CheckpointRow> checkpoints;
  std::optional<kit::Trajectory> trajectory;
  std::optional<kit::KitManifest> manifest;
  Digest kit_json_sha256{};
};

Source ReadSource(const fs::path& dir) {
  Source s;
  if (fs::exists(dir / kit::kManifestName)) {
    s.kind = "kit";
    s.manifest = kit::ReadManifest(dir);
    s.kit_json_sha256 = Sha256(ReadFileBytes(dir / kit::kManifestName));
    s.trajectory = kit::ReadTrajectory(dir);
    s.descriptor = s.trajectory->descriptor;
    // The kit's chain is the units' expected hashes (the init's is step 0); its checkpoints are
    // where the intervals start and end.
    std::map<uint64_t, Digest> hashes;
    std::set<uint64_t> checkpoints;
    for (const kit::Unit& u : s.trajectory->units) {
      hashes[u.until_step] = u.expected_hash;
      if (u.kind == kit::UnitKind::kInterval) checkpoints.insert({u.start_step, u.until_step});
    }
    for (const auto& [step, hash] : hashes) s.chain.push_back({step, hash});
    for (const uint64_t step : checkpoints) {
      const auto it = hashes.find(step);
      s.checkpoints.push_back({step, it == hashes.end() ? Digest{} : it->second});
    }
    return s;
  }
  if (!fs::exists(RunLayout{dir}.hashes())) {
    Fail("{}: neither a run directory (state_hashes.jsonl) nor a kit (kit.json)", dir.string());
  }
  s.kind = "run";
  // A run killed mid-append may end in a torn line: the page shows the steps before it.
  s.chain = ReadStateHashLines(RunLayout{dir}.hashes(), TornLine::kDrop);
  if (fs::exists(RunLayout{dir}.metrics())) {
    s.metrics = train::ReadMetrics(RunLayout{dir}.metrics(), TornLine::kDrop);
  }
  for (const uint64_t step : CompleteCheckpointSteps(dir)) {
    const CheckpointIndex index = OpenCheckpoint(CheckpointDir(dir, step));
    s.checkpoints.push_back({step, index.state_hash});
    s.descriptor = index.state.descriptor;
  }
  return s;
}

// One unit of `lockstep audit --json-out` (docs/kits.md, "audit").
struct AuditRow {
  std::string unit, kind, verdict, error;
  uint64_t start_step = 0, until_step = 0;
  std::string expected, replayed;
  std::optional<double> wall, publisher_wall;
  std::optional<uint64_t> peak_rss, planned_rss;
};

std::vector<AuditRow> ReadAudit(const fs::path& path) {
  const std::string what = path.string();
  const json report = ParseJsonStrict(ReadFileText(path, kMaxJsonBytes, "an audit report"), what);
  if (!report.is_array()) Fail("{}: not a JSON array (lockstep audit --json-out writes one)", what);
  std::vector<AuditRow> rows;
  for (size_t i = 0; i < report.size(); ++i) {
    const std::string at = fmt::format("{}: [{}]", what, i);
    const json& u = report[i];
    const auto string = [&](const json& object, const char* key) {
      if (!object.is_object() || !object.contains(key) || !object[key].is_string()) {
        Fail("{}: field \"{}\" is not a string", at, key);
      }
      return object[key].get<std::string>();
    };
    const auto unsigned_field = [&](const char* key) {
      if (!u.contains(key) || !u[key].is_number_unsigned()) {
        Fail("{}: field \"{}\" is not an unsigned integer", at, key);
      }
      return u[key].get<uint64_t>();
    };
    AuditRow row{.unit = string(u, "unit"), .kind = string(u, "kind"),
                 .verdict = string(u, "verdict"), .error = {},
                 .start_step = unsigned_field("start_step"),
                 .until_step = unsigned_field("until_step"), .expected = string(u, "expected"),
                 .replayed = {}, .wall = {}, .publisher_wall = {}, .peak_rss = {},
                 .planned_rss = {}};
    // The optional fields: absent (or null), or of their type and range; anything else is
    // refused, naming it, never shown as an empty cell or an impossible time.
    const auto present = [](const json& object, const char* key) {
      return object.contains(key) && !object[key].is_null();
    };
    const auto seconds = [&](const json& object, const char* key) -> std::optional<double> {
      if (!present(object, key)) return std::nullopt;
      const json& v = object[key];
      if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>())) {
        Fail("{}: field \"{}\" is {}, expected a finite number of seconds >= 0", at, key,
             ShownJson(v));
      }
      return v.get<double>();
    };
    const auto bytes = [&](const json& object, const char* key) -> std::optional<uint64_t> {
      if (!present(object, key)) return std::nullopt;
      if (!object[key].is_number_unsigned()) {
        Fail("{}: field \"{}\" is {}, expected an unsigned integer", at, key,
             ShownJson(object[key]));
      }
      return object[key].get<uint64_t>();
    };
    if (present(u, "error")) row.error = string(u, "error");
    row.publisher_wall = seconds(u, "publisher_wall_seconds");
    if (present(u, "replay")) {
      const json& r = u["replay"];
      if (!r.is_object()) Fail("{}: field \"replay\" is {}, expected an object", at, ShownJson(r));
      if (present(r, "state_hash")) row.replayed = string(r, "state_hash");
      row.wall = seconds(r, "wall_seconds");
      row.peak_rss = bytes(r, "peak_rss_bytes");
      row.planned_rss = bytes(r, "planned_peak_rss_bytes");
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// An audit report is shown on the page of one run or kit, so every row must be an audit of it:
// a unit the kit holds (for a run: a step its chain holds, starting at one of its checkpoints)
// with the same steps and expected hash, a known verdict that agrees with the hashes in the row,
// each unit once. Anything else is another run's audit or an edited one, and is refused.
void CheckAuditIsOfSource(const std::vector<AuditRow>& audit, const Source& s, const fs::path& path,
                          const fs::path& source) {
  std::set<std::string> seen;
  for (size_t i = 0; i < audit.size(); ++i) {
    const AuditRow& r = audit[i];
    const std::string at = fmt::format("{}: [{}] (unit \"{}\")", path.string(), i, r.unit);
    if (!seen.insert(r.unit).second) Fail("{}: the unit appears twice", at);
    if (r.kind != "init" && r.kind != "interval") {
      Fail("{}: field \"kind\" is \"{}\", not init or interval", at, r.kind);
    }
    const Digest expected = DigestFromHex(r.expected, at + ": field \"expected\"");
    std::optional<Digest> replayed;
    if (!r.replayed.empty()) {
      replayed = DigestFromHex(r.replayed, at + ": field \"replay.state_hash\"");
    }
    CheckVerdictAgreesWithHashes(r.verdict, expected, replayed, !r.error.empty(), at);
    if (r.kind == "init" && (r.start_step != 0 || r.until_step != 0)) {
      Fail("{}: an init unit covers step 0, not {}-{}", at, r.start_step, r.until_step);
    }
    if (s.trajectory) {
      KitUnitOf(*s.trajectory, (source / kit::kTrajectoryName).string(), r.unit, r.kind,
                r.start_step, r.until_step, expected, at);
      continue;
    }
    const auto line = std::ranges::find(s.chain, r.until_step, &StateHashLine::step);
    if (line == s.chain.end()) {
      Fail(
          "{}: expects a hash at step {}, and {} has no such step: this is not an audit of this "
          "run",
          at, r.until_step, RunLayout{source}.hashes().string());
    }
    if (line->hash != expected) {
      Fail("{}: expects {} at step {}, the run's chain has {}: this is not an audit of this run",
           at, r.expected, r.until_step, ToHex(line->hash));
    }
    if (r.kind == "interval" && std::ranges::find(s.checkpoints, r.start_step,
                                                  &CheckpointRow::step) == s.checkpoints.end()) {
      Fail(
          "{}: starts at step {}, where the run has no complete checkpoint: this is not an "
          "audit of this run",
          at, r.start_step);
    }
  }
}

constexpr std::string_view kStyle = R"(
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px; color: #1d2330; }
h1 { font-size: 22px; margin-bottom: 2px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #dde; }
.sub { color: #5a6270; } code, .hash { font-family: ui-monospace, monospace; font-size: 12px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { padding: 3px 10px; border-bottom: 1px solid #eef; text-align: left; }
th { background: #f4f6fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.MATCH { color: #0a7a32; font-weight: 600; } .MISMATCH, .ERROR { color: #b3261e; font-weight: 600; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; } .plot { background: #fbfcfe; border: 1px solid #e3e7ef; }
.plot .title { font-weight: 600; font-size: 13px; } .plot .tick { font-size: 10px; fill: #5a6270; }
.plot .legend { font-size: 11px; } .plot .frame { fill: none; stroke: #c9cfdb; }
.plot .grid { stroke: #eceff5; } .plot .checkpoint { stroke: #7d8aa6; stroke-dasharray: 3 3; }
.plot .threshold { stroke: #d08a00; stroke-dasharray: 6 3; } .plot .skipped { fill: #b3261e; }
.plot .clipped { fill: #d08a00; } td { white-space: nowrap; } td.why { white-space: normal; min-width: 420px; }
)";

}  // namespace

std::string CoverageHtmlSection(const json& c) {
  const json& sum = c["summary"];
  std::string html = fmt::format(
      "<h2>Coverage</h2>\n<p id=\"coverage-summary\">{} of {} units confirmed by at least {} "
      "distinct key{}; {} unaudited; {} disputed. Receipts: {} counted, {} not counted, {} "
      "refused. Proofs of replay {}; {} of the counted receipts' unit proofs unchecked.</p>\n",
      sum["confirmed"].get<size_t>(), sum["units"].get<size_t>(), c["threshold"].get<int>(),
      c["threshold"].get<int>() == 1 ? "" : "s", sum["unaudited"].get<size_t>(),
      sum["disputed"].get<size_t>(), sum["receipts_counted"].get<size_t>(),
      sum["receipts_not_counted"].get<size_t>(), sum["receipts_refused"].get<size_t>(),
      c["proofs_checked"].get<bool>() ? "checked against the publisher's losses"
                                      : "not checked (no --metrics)",
      sum["proofs_unchecked"].get<size_t>());
  const auto list = [](const json& values, bool keys) {
    std::string out;
    for (const json& v : values) {
      const std::string text = v.get<std::string>();
      out += (out.empty() ? "" : "<br>") +
             (keys ? fmt::format("<span class=\"hash\" title=\"{}\">{}</span>", Escape(text),
                                 Escape(text.substr(0, 16)))
                   : Escape(text));
    }
    return out;
  };
  html +=
      "<table id=\"coverage\"><tr><th>unit</th><th>steps</th><th>status</th>"
      "<th>keys (MATCH)</th><th>CPUs</th><th>SIMD</th><th>devices</th><th>compilers</th>"
      "</tr>";
  for (const json& u : c["units"]) {
    const std::string status = u["status"].get<std::string>();
    html += fmt::format(
        "<tr class=\"unit\" data-unit=\"{}\" data-status=\"{}\" data-keys=\"{}\"><td>{}</td>"
        "<td class=\"num\">{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td></tr>",
        Escape(u["unit"].get<std::string>()), Escape(status), u["match_keys"].size(),
        Escape(u["unit"].get<std::string>()),
        u["kind"] == "init" ? std::string("init")
                            : fmt::format("{} → {}", u["start_step"].get<uint64_t>(),
                                          u["until_step"].get<uint64_t>()),
        status == "confirmed"                          ? "MATCH"
        : status == "conflict" || status == "mismatch" ? "MISMATCH"
                                                       : "",
        Escape(status), list(u["match_keys"], true), list(u["cpus"], false),
        list(u["simd_variants"], false), list(u["devices"], false), list(u["compilers"], false));
  }
  html += "</table>\n";
  // Every receipt of a disputed unit, side by side.
  std::string disputes;
  for (const json& u : c["units"]) {
    if (u["mismatch_keys"].empty()) continue;
    for (const json& r : u["receipts"]) {
      disputes += fmt::format(
          "<tr class=\"dispute\" data-unit=\"{}\"><td>{}</td><td class=\"hash\">{}</td>"
          "<td class=\"{}\">{}</td><td class=\"hash\">{}</td><td>{}</td><td>{}</td></tr>",
          Escape(u["unit"].get<std::string>()), Escape(u["unit"].get<std::string>()),
          Escape(r["signer"].get<std::string>().substr(0, 16)),
          Escape(r["verdict"].get<std::string>()), Escape(r["verdict"].get<std::string>()),
          Escape(r["replayed"].is_string() ? r["replayed"].get<std::string>() : "-"),
          Escape(r["proof"].get<std::string>()), Escape(r["file"].get<std::string>()));
    }
  }
  if (!disputes.empty()) {
    html +=
        "<h3>Disputed units: every receipt</h3>\n<table id=\"disputes\"><tr><th>unit</th>"
        "<th>key</th><th>verdict</th><th>replayed</th><th>proof</th><th>receipt</th></tr>" +
        disputes + "</table>\n";
  }
  html +=
      "<h3>Receipts</h3>\n<table id=\"receipts\"><tr><th>receipt</th><th>key</th>"
      "<th>status</th><th>why</th></tr>";
  for (const json& r : c["receipts"]) {
    const std::string status = r["status"].get<std::string>();
    html += fmt::format(
        "<tr class=\"receipt\" data-status=\"{}\"><td>{}</td><td class=\"hash\">{}</td>"
        "<td class=\"{}\">{}</td><td class=\"why\">{}</td></tr>",
        Escape(status), Escape(r["file"].get<std::string>()),
        r["signer"].is_string() ? Escape(r["signer"].get<std::string>().substr(0, 16)) : "-",
        status == "refused" ? "ERROR" : "", Escape(status),
        r["reason"].is_string() ? Escape(r["reason"].get<std::string>()) : "");
  }
  return html + "</table>\n";
}

std::string CoveragePage(const json& coverage) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>lockstep "
      "coverage: kit {}</title><style>{}</style></head><body>\n<h1>lockstep coverage</h1><div "
      "class=\"sub\">kit.json sha256 <span class=\"hash\">{}</span> · {}</div>\n{}</body></html>\n",
      Escape(coverage["kit_json_sha256"].get<std::string>().substr(0, 16)), kStyle,
      Escape(coverage["kit_json_sha256"].get<std::string>()),
      Escape(std::string("lockstep ") + build::kVersion + " " + build::kGitCommit),
      CoverageHtmlSection(coverage));
}

// A run's curves on the page: its metrics, the label its series carry ("" alone), and whether
// they are drawn dashed (--compare's).
struct Curves {
  const Source* source = nullptr;
  std::string label;
  bool dashed = false;
};

// The config's name a run descriptor holds ("" when it holds none).
std::string ConfigName(const json& descriptor) {
  return descriptor.is_object() && descriptor.contains("name") && descriptor["name"].is_string()
             ? descriptor["name"].get<std::string>()
             : std::string();
}

// The labels of SOURCE (path a, config ca) and --compare (b, cb): their configs' names, or where
// those are equal their directories' names, or where those are too the paths given.
std::pair<std::string, std::string> CompareLabels(const fs::path& a, const std::string& ca,
                                                  const fs::path& b, const std::string& cb) {
  if (!ca.empty() && !cb.empty() && ca != cb) return {ca, cb};
  const std::string da = fs::absolute(a).lexically_normal().filename().string();
  const std::string db = fs::absolute(b).lexically_normal().filename().string();
  if (!da.empty() && !db.empty() && da != db) return {da, db};
  return {a.string(), b.string()};
}

// The runs side by side: steps, last loss, and the mean loss over the last 50 steps (or all,
// when fewer) with each run's over the first's.
std::string CompareTable(const std::vector<const Curves*>& curves) {
  std::string html =
      "<table id=\"compare\"><tr><th>run</th><th>steps</th><th>last loss</th>"
      "<th>mean loss, last 50 steps</th><th>over the first run's</th></tr>";
  double first = 0;
  for (const Curves* c : curves) {
    const std::vector<train::MetricsLine>& m = c->source->metrics;
    const size_t from = m.size() > 50 ? m.size() - 50 : 0;
    double sum = 0;
    for (size_t i = from; i < m.size(); ++i) sum += m[i].loss;
    const double mean = sum / static_cast<double>(m.size() - from);
    if (c == curves.front()) first = mean;
    html += fmt::format(
        "<tr class=\"run\" data-run=\"{}\"><td>{}{}</td><td class=\"num\">{}</td>"
        "<td class=\"num\">{:.4f}</td><td class=\"num\" data-mean-loss=\"{:.17g}\">{:.5f} ({} "
        "steps)</td><td class=\"num\">{:.5f}</td></tr>",
        Escape(c->label), Escape(c->label), c->dashed ? " (dashed)" : "", m.back().step,
        m.back().loss, mean, mean, m.size() - from, mean / first);
  }
  return html + "</table>\n";
}

void WriteReport(const ReportOptions& o) {
  const Source s = ReadSource(o.source);
  const std::vector<AuditRow> audit = o.audit ? ReadAudit(*o.audit) : std::vector<AuditRow>{};
  if (o.audit) CheckAuditIsOfSource(audit, s, *o.audit, o.source);
  json descriptor = json::object();
  if (!s.descriptor.empty()) {
    descriptor = ParseJsonStrict(s.descriptor, o.source.string() + ": the run descriptor");
    if (!descriptor.is_object()) Fail("{}: the run descriptor is not a JSON object", o.source.string());
  }
  const auto field = [&](const char* section, const char* key) -> json {
    return descriptor.contains(section) && descriptor[section].contains(key) ? descriptor[section][key]
                                                                             : json();
  };
  const std::string name = ConfigName(descriptor);

  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<title>lockstep report: {}</title><style>{}</style></head><body>\n",
      Escape(name), kStyle);
  html += fmt::format("<h1>lockstep {} report: {}</h1><div class=\"sub\">{} · {} · numerics "
                      "contract {}</div>\n",
                      s.kind, Escape(name), Escape(o.source.string()), Escape(std::string(build::kVersion) + " " + build::kGitCommit),
                      Escape(descriptor.value("contract_version", json()).dump()));

  // The chain and its checkpoints.
  html += "<h2>Chain</h2>\n<table id=\"chain\">";
  if (!s.chain.empty()) {
    html += fmt::format("<tr><th>steps committed</th><td class=\"num\">{}</td></tr>"
                        "<tr><th>head</th><td>step {} <span class=\"hash\" id=\"chain-head\">{}</span></td></tr>",
                        s.chain.size(), s.chain.back().step, ToHex(s.chain.back().hash));
  }
  html += "</table>\n<table id=\"checkpoints\"><tr><th>checkpoint</th><th>state hash</th></tr>";
  for (const CheckpointRow& c : s.checkpoints) {
    html += fmt::format("<tr><td class=\"num\">{}</td><td class=\"hash\">{}</td></tr>", c.step,
                        ToHex(c.state_hash));
  }
  html += "</table>\n";

  // Training curves, with --compare's beside SOURCE's.
  std::optional<Source> other;
  std::vector<const Curves*> curves;
  Curves mine{&s, "", false}, theirs;
  curves.push_back(&mine);
  if (o.compare) {
    if (s.metrics.empty()) {
      Fail(
          "--compare draws two runs' training curves, and SOURCE {} has none (a kit, or a run "
          "with no completed step): give a run directory",
          o.source.string());
    }
    other = ReadSource(*o.compare);
    if (other->metrics.empty()) {
      Fail(
          "--compare {}: no training curves to draw (a kit holds no metrics.jsonl, or the run "
          "has no completed step): give a run directory",
          o.compare->string());
    }
    const auto [a, b] = CompareLabels(o.source, name, *o.compare,
                                      ConfigName(json::parse(other->descriptor, nullptr, false)));
    mine.label = a;
    theirs = {&*other, b, true};
    curves.push_back(&theirs);
  }
  std::vector<uint64_t> checkpoint_steps;
  for (const CheckpointRow& c : s.checkpoints) checkpoint_steps.push_back(c.step);
  html += "<h2>Training</h2>\n";
  if (s.metrics.empty()) {
    html += "<p class=\"sub\" id=\"no-metrics\">No metrics: " +
            std::string(s.kind == "kit" ? "a kit holds the chain and checkpoints, not the run's "
                                          "metrics.jsonl (report on the run directory for them)."
                                        : "the run has no completed step.") +
            "</p>\n";
  } else {
    // Each plot's series: SOURCE's, then --compare's dashed, each named with its run's label.
    const auto series = [&](const std::string& label, const char* color,
                            double train::MetricsLine::*f) {
      std::vector<Series> out;
      for (const Curves* c : curves) {
        Series line{c->label.empty() ? label : label + " · " + c->label, color, {}, c->dashed};
        for (const train::MetricsLine& m : c->source->metrics) {
          if (std::isfinite(m.*f)) line.points.emplace_back(static_cast<double>(m.step), m.*f);
        }
        out.push_back(std::move(line));
      }
      return out;
    };
    std::vector<std::tuple<double, std::string, std::string>> skipped, clipped;
    for (const train::MetricsLine& m : s.metrics) {
      const auto step = static_cast<double>(m.step);
      if (m.skipped) {
        skipped.emplace_back(step, "skipped", "update skipped by the spike protocol");
      } else if (m.clip_factor < 1) {
        clipped.emplace_back(step, "clipped", fmt::format("clipped by {:.4g}", m.clip_factor));
      }
    }
    std::vector<Series> loss = series("loss", "#2456c8", &train::MetricsLine::loss);
    const bool zloss = std::ranges::any_of(curves, [](const Curves* c) {
      return std::ranges::any_of(c->source->metrics, [](const auto& m) { return m.zloss != 0; });
    });
    if (zloss)
      std::ranges::move(series("z-loss", "#8a3fc0", &train::MetricsLine::zloss),
                        std::back_inserter(loss));
    const std::vector<std::tuple<double, std::string, std::string>> loss_marks = skipped;
    PlotSpec norm{"grad-norm",      "gradient norm (before clipping)",
                  "norm",           series("grad norm", "#0a7a32", &train::MetricsLine::grad_norm),
                  checkpoint_steps, skipped,
                  std::nullopt,     true};
    if (const json clip = field("train", "clip_norm"); clip.is_number() && clip.get<double>() > 0) {
      norm.threshold = {clip.get<double>(), fmt::format("clip_norm {}", clip.dump())};
    }
    norm.marks.insert(norm.marks.end(), clipped.begin(), clipped.end());
    html += "<div class=\"plots\">\n";
    html += Plot({"loss", "loss", "nats/token", loss, checkpoint_steps, loss_marks, std::nullopt, false});
    html += Plot(norm);
    // A plot of one quantity, with the checkpoints and nothing else marked.
    const auto plain = [&](const char* id, const char* title, const char* unit, const char* color,
                           double train::MetricsLine::*f) {
      return Plot({id, title, unit, series(unit, color, f), checkpoint_steps, {}, {}, false});
    };
    html += plain("lr", "learning rate", "lr", "#d08a00", &train::MetricsLine::lr);
    html += plain("tokens-per-second", "throughput", "tokens/s", "#5a6270",
                  &train::MetricsLine::tokens_per_second);
    html += "</div>\n";
    if (other) html += CompareTable(curves);
    const train::MetricsLine& last = s.metrics.back();
    double seconds = 0;
    for (const train::MetricsLine& m : s.metrics) seconds += m.step_seconds;
    html += fmt::format(
        "<table id=\"last-step\"><tr><th>last step</th><td class=\"num\">{}</td></tr>"
        "<tr><th>loss</th><td class=\"num\">{:.4f}</td></tr>"
        "<tr><th>gradient norm</th><td class=\"num\">{:.4f}</td></tr>"
        "<tr><th>tokens</th><td class=\"num\">{}</td></tr>"
        "<tr><th>skipped steps</th><td class=\"num\">{}</td></tr>"
        "<tr><th>clipped steps</th><td class=\"num\">{}</td></tr>"
        "<tr><th>training time</th><td class=\"num\">{:.1f} s</td></tr></table>\n",
        last.step, last.loss, last.grad_norm, last.tokens, skipped.size(), clipped.size(), seconds);
  }

  // The audit.
  html += "<h2>Audit</h2>\n";
  if (!o.audit) {
    html += "<p class=\"sub\">No audit given (lockstep audit KIT --json-out AUDIT.json, then "
            "--audit AUDIT.json).</p>\n";
  } else {
    html += "<table id=\"audit\"><tr><th>unit</th><th>steps</th><th>expected</th><th>replayed</th>"
            "<th>verdict</th><th>wall s</th><th>publisher s</th><th>peak RSS</th><th>plan</th></tr>";
    for (const AuditRow& r : audit) {
      html += fmt::format(
          "<tr class=\"unit\" data-unit=\"{}\"><td>{}</td><td class=\"num\">{}</td>"
          "<td class=\"hash\" title=\"{}\">{}</td><td class=\"hash\" title=\"{}\">{}</td>"
          "<td class=\"{}\">{}</td>"
          "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
          "<td class=\"num\">{}</td></tr>",
          Escape(r.unit), Escape(r.unit),
          r.kind == "init" ? std::string("init") : fmt::format("{} → {}", r.start_step, r.until_step),
          Escape(r.expected), Escape(r.expected.substr(0, 16)),
          Escape(r.replayed.empty() ? r.error : r.replayed),
          Escape(r.replayed.empty() ? r.error : r.replayed.substr(0, 16)), Escape(r.verdict),
          Escape(r.verdict), r.wall ? fmt::format("{:.2f}", *r.wall) : "",
          r.publisher_wall ? fmt::format("{:.2f}", *r.publisher_wall) : "",
          r.peak_rss ? MiB(*r.peak_rss) : "", r.planned_rss ? MiB(*r.planned_rss) : "");
    }
    const size_t matched = static_cast<size_t>(
        std::ranges::count_if(audit, [](const AuditRow& r) { return r.verdict == "MATCH"; }));
    html += fmt::format("</table>\n<p id=\"audit-summary\">{} of {} units MATCH</p>\n", matched,
                        audit.size());
  }

  // The run's configuration and, for a kit, what it holds.
  html += "<h2>Configuration</h2>\n<table id=\"config\">";
  for (const char* section : {"model", "train"}) {
    if (!descriptor.contains(section) || !descriptor[section].is_object()) continue;
    for (const auto& [key, value] : descriptor[section].items()) {
      html += fmt::format("<tr><th>{}.{}</th><td>{}</td></tr>", section, Escape(key),
                          Escape(value.dump()));
    }
  }
  html += fmt::format("<tr><th>data manifest</th><td class=\"hash\">{}</td></tr></table>\n",
                      Escape(descriptor.contains("data_manifest_blake2b")
                                 ? descriptor["data_manifest_blake2b"].dump()
                                 : std::string()));
  if (s.manifest) {
    uint64_t bytes = 0;
    for (const kit::KitFile& f : s.manifest->files) bytes += f.size;
    html += fmt::format(
        "<h2>Kit</h2>\n<table id=\"kit\"><tr><th>kit.json sha256</th><td class=\"hash\">{}</td></tr>"
        "<tr><th>files</th><td class=\"num\">{} ({})</td></tr><tr><th>units</th><td class=\"num\">{}"
        "</td></tr><tr><th>built by</th><td>lockstep {} ({})</td></tr></table>\n",
        ToHex(s.kit_json_sha256), s.manifest->files.size(), MiB(bytes), s.trajectory->units.size(),
        Escape(s.manifest->lockstep_version), Escape(s.manifest->git_commit));
  }
  if (o.coverage) {
    if (s.kind != "kit") Fail("--receipt: receipts are of a kit: give the kit as SOURCE");
    html += CoverageHtmlSection(*o.coverage);
  }
  html += "</body></html>\n";
  ReplaceFileSynced(o.out, html);
}

}  // namespace lockstep::audit
