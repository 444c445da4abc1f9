// lockstep report: the page of a trained, kitted and audited run, rendered by headless Chromium
// with no network at all, holds the plots with one point per step, the checkpoints and clipped
// steps marked, the chain's head and the audit table with the right numbers; it refers to
// nothing outside itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/chromium.h"
#include "common/run_lockstep.h"
#include "common/scratch_dir.h"
#include "lockstep/train.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using test::Count;
using test::Have;
using test::Lockstep;
using test::RenderedDom;
using test::Result;

class Report : public test::ScratchDirTest {};

TEST_F(Report, ThePageOfAnAuditedRunShowsItsNumbersOffline) {
  const std::string d = dir_.string();
  ASSERT_EQ(Lockstep("data synth --out " + d + "/data --seed 3 --tokens 200000").exit_code, 0);
  const Result trained = Lockstep("train --config tiny --data " + d + "/data --out " + d +
                                  "/run --steps 20 --no-progress");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  ASSERT_EQ(Lockstep("kit build --run " + d + "/run --data " + d + "/data --out " + d + "/kit")
                .exit_code,
            0);
  const Result audited = Lockstep("audit " + d + "/kit --all --json-out " + d + "/audit.json");
  ASSERT_EQ(audited.exit_code, 0) << audited.output;
  const Result reported =
      Lockstep("report " + d + "/run --audit " + d + "/audit.json --out " + d + "/report.html");
  ASSERT_EQ(reported.exit_code, 0) << reported.output;

  // Self-contained: no script, stylesheet, image or font from anywhere (the one URL is SVG's
  // namespace name, which is never fetched).
  const std::string page = ReadFileText(dir_ / "report.html");
  for (const char* forbidden : {"<script", "<link", "<img", "<iframe", "src=", "url(", "@import"}) {
    EXPECT_EQ(page.find(forbidden), std::string::npos) << forbidden;
  }
  std::string without_namespace = page;
  for (size_t at; (at = without_namespace.find("http://www.w3.org/2000/svg")) != std::string::npos;) {
    without_namespace.erase(at, 26);
  }
  EXPECT_EQ(without_namespace.find("http"), std::string::npos);

  // The kit's page: its units and chain, no metrics.
  ASSERT_EQ(Lockstep("report " + d + "/kit --out " + d + "/kit.html").exit_code, 0);
  const std::string kit_page = ReadFileText(dir_ / "kit.html");
  EXPECT_NE(kit_page.find("id=\"no-metrics\""), std::string::npos);
  EXPECT_NE(kit_page.find(ToHex(Sha256(ReadFileBytes(dir_ / "kit/kit.json")))), std::string::npos);

  // Bad input is refused naming the file.
  WriteFileSynced(dir_ / "bad.json", "{\"unit\": 1}");
  const Result bad =
      Lockstep("report " + d + "/run --audit " + d + "/bad.json --out " + d + "/bad.html");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("bad.json"), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(dir_ / "bad.html"));

  // An audit that is not of this run or kit, or contradicts itself, is refused, naming the row;
  // the page shows only what it can check.
  const nlohmann::json audit = nlohmann::json::parse(ReadFileText(dir_ / "audit.json"));
  const std::string other_hash = std::string(64, 'a');
  const std::vector<std::tuple<std::string, std::function<void(nlohmann::json&)>, std::string>>
      edits = {
          {"a unit the kit lacks", [](nlohmann::json& a) { a[1]["unit"] = "interval_0_30"; },
           "no such unit"},
          {"another run's expected hash",
           [&](nlohmann::json& a) {
             a[1]["expected"] = other_hash;
             a[1]["replay"]["state_hash"] = other_hash;
           },
           "not an audit of this"},
          {"a MATCH whose replayed hash differs",
           [&](nlohmann::json& a) { a[2]["replay"]["state_hash"] = other_hash; },
           "verdict MATCH, but the replayed hash"},
          {"an unknown verdict", [](nlohmann::json& a) { a[0]["verdict"] = "PROBABLY"; },
           "not MATCH, MISMATCH or ERROR"},
          {"a two-character hash", [](nlohmann::json& a) { a[0]["expected"] = "ab"; },
           "\"expected\""},
          {"a unit twice", [](nlohmann::json& a) { a.push_back(a[0]); }, "appears twice"},
          {"steps that are not the unit's", [](nlohmann::json& a) { a[1]["until_step"] = 20; },
           "not an audit of this"},
      };
  for (const auto& [what, edit, message] : edits) {
    for (const std::string source : {"run", "kit"}) {
      // A run names no units: there a unit is checked by its steps and hashes.
      if (source == "run" && what == "a unit the kit lacks") continue;
      nlohmann::json edited = audit;
      edit(edited);
      WriteFileSynced(dir_ / "edited.json", edited.dump(2));
      const Result refused = Lockstep("report " + d + "/" + source + " --audit " + d +
                                      "/edited.json --out " + d + "/edited.html");
      EXPECT_EQ(refused.exit_code, 2) << what << " (" << source << "): " << refused.output;
      EXPECT_NE(refused.output.find("edited.json"), std::string::npos) << refused.output;
      EXPECT_NE(refused.output.find(message), std::string::npos)
          << what << " (" << source << "): " << refused.output;
      EXPECT_FALSE(fs::exists(dir_ / "edited.html")) << what;
    }
  }
  // The same audit is accepted on the kit's page too.
  EXPECT_EQ(
      Lockstep("report " + d + "/kit --audit " + d + "/audit.json --out " + d + "/kit-audit.html")
          .exit_code,
      0);

  if (!Have("chromium --version")) {
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it): the page "
                    "was checked as text only";
  }
  const std::string dom = RenderedDom(dir_ / "report.html", dir_);
  ASSERT_NE(dom.find("</html>"), std::string::npos) << dom.substr(0, 500);

  // The four plots, each series with one point per step.
  const std::vector<train::MetricsLine> metrics = train::ReadMetrics(dir_ / "run/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 20u);
  for (const char* plot : {"plot-loss", "plot-grad-norm", "plot-lr", "plot-tokens-per-second"}) {
    EXPECT_NE(dom.find(fmt::format("id=\"{}\"", plot)), std::string::npos) << plot;
  }
  for (const char* series : {"loss", "grad norm", "lr", "tokens/s"}) {
    EXPECT_NE(dom.find(fmt::format("data-series=\"{}\" data-points=\"20\"", series)),
              std::string::npos)
        << series;
  }
  // Checkpoints 0, 10 and 20 on each of the four plots; every clipped step marked.
  for (const int step : {0, 10, 20}) {
    EXPECT_EQ(Count(dom, fmt::format("class=\"checkpoint\" data-step=\"{}\"", step)), 4u) << step;
  }
  const size_t clipped = static_cast<size_t>(std::ranges::count_if(
      metrics, [](const train::MetricsLine& m) { return !m.skipped && m.clip_factor < 1; }));
  EXPECT_GT(clipped, 0u);
  EXPECT_EQ(Count(dom, "class=\"mark clipped\""), clipped);
  EXPECT_NE(dom.find(fmt::format("<th>loss</th><td class=\"num\">{:.4f}</td>", metrics.back().loss)),
            std::string::npos);

  // The chain's head and the audit table: every unit MATCH with the chain's hashes.
  const std::vector<StateHashLine> chain = ReadStateHashLines(dir_ / "run/state_hashes.jsonl");
  EXPECT_NE(dom.find(fmt::format("id=\"chain-head\">{}<", ToHex(chain.back().hash))),
            std::string::npos);
  for (const auto& [unit, step] :
       std::vector<std::pair<std::string, size_t>>{{"init", 0}, {"interval_0_10", 10},
                                                   {"interval_10_20", 20}}) {
    const std::regex row(fmt::format("data-unit=\"{}\">.*?title=\"{}\".*?class=\"MATCH\">MATCH<",
                                     unit, ToHex(chain[step].hash)));
    EXPECT_TRUE(std::regex_search(dom, row)) << unit;
  }
  EXPECT_NE(dom.find("3 of 3 units MATCH"), std::string::npos);
}

// --compare: a second run's curves, dashed, on the same four plots, each series named with its
// run's config and one point per step; a table of both runs' mean loss over their last 50 steps
// (here all 12) as the metrics give it, and the second's over the first's. A kit on either side,
// or --out onto the compared run's files, is refused.
TEST_F(Report, CompareDrawsBothRunsOnOnePlot) {
  const std::string d = dir_.string();
  ASSERT_EQ(Lockstep("data synth --out " + d + "/data --seed 3 --tokens 200000").exit_code, 0);
  for (const char* config : {"tiny", "tiny-int8"}) {
    const Result r = Lockstep(std::string("train --config ") + config + " --data " + d +
                              "/data --out " + d + "/" + config + " --steps 12 --no-progress");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const Result r =
      Lockstep("report " + d + "/tiny --compare " + d + "/tiny-int8 --out " + d + "/both.html");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string page = ReadFileText(dir_ / "both.html");
  for (const char* series : {"loss", "z-loss", "grad norm", "lr", "tokens/s"}) {
    EXPECT_EQ(Count(page, fmt::format("data-series=\"{} · tiny\" data-points=\"12\" ", series)), 1u)
        << series << "\n"
        << page;
    EXPECT_EQ(
        Count(page, fmt::format("data-series=\"{} · tiny-int8\" data-points=\"12\" ", series)), 1u)
        << series;
  }
  EXPECT_EQ(Count(page, "stroke-dasharray=\"5 3\""), 5u);  // tiny-int8's five series
  std::vector<double> means;
  for (const char* run : {"tiny", "tiny-int8"}) {
    const std::vector<train::MetricsLine> m = train::ReadMetrics(dir_ / run / "metrics.jsonl");
    double sum = 0;
    for (const train::MetricsLine& line : m) sum += line.loss;
    means.push_back(sum / static_cast<double>(m.size()));
    const std::regex row(
        fmt::format("data-run=\"{}\">.*?data-mean-loss=\"([-0-9.e+]+)\">.*?\\(12 steps\\)</td><td "
                    "class=\"num\">([0-9.]+)</td>",
                    run));
    std::smatch match;
    ASSERT_TRUE(std::regex_search(page, match, row)) << run;
    EXPECT_EQ(std::stod(match[1].str()), means.back()) << run;
    EXPECT_EQ(match[2].str(), fmt::format("{:.5f}", means.back() / means.front())) << run;
  }
  EXPECT_NE(means[0], means[1]);

  ASSERT_EQ(Lockstep("kit build --run " + d + "/tiny --data " + d + "/data --out " + d + "/kit")
                .exit_code,
            0);
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {d + "/tiny --compare " + d + "/kit", "--compare " + d + "/kit: no training curves"},
           {d + "/kit --compare " + d + "/tiny", "SOURCE " + d + "/kit has none"},
       }) {
    const Result refused = Lockstep("report " + args + " --out " + d + "/refused.html");
    EXPECT_EQ(refused.exit_code, 2) << args << ": " << refused.output;
    EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
    EXPECT_FALSE(fs::exists(dir_ / "refused.html"));
  }
  const std::string metrics = ReadFileText(dir_ / "tiny-int8/metrics.jsonl");
  const Result onto = Lockstep("report " + d + "/tiny --compare " + d + "/tiny-int8 --out " + d +
                               "/tiny-int8/metrics.jsonl");
  EXPECT_EQ(onto.exit_code, 2) << onto.output;
  EXPECT_EQ(ReadFileText(dir_ / "tiny-int8/metrics.jsonl"), metrics);
}

}  // namespace
}  // namespace lockstep
