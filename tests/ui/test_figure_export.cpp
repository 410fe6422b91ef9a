// Figure export through QPainter (PNG, SVG, PDF) and `kvlens-cli figure`: the files parse as what
// they claim, have the figure's size, are not blank, differ between policies, and bad input gets
// one clear error without a file left behind.
#include <unistd.h>
#include <QFile>
#include <QImage>
#include <QXmlStreamReader>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine/common/error.h"
#include "engine/trace/trace.h"
#include "tests/support/small_trace.h"
#include "tests/support/test_paths.h"
#include "viz/qt/painter_renderer.h"
#include "viz/views.h"

using namespace kvlens;
using namespace kvlens::viz;
namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Distinct colours in an image: a blank render has one or two.
size_t distinct_colors(const QImage& image) {
  std::set<QRgb> colors;
  for (int y = 0; y < image.height(); y += 2)
    for (int x = 0; x < image.width(); x += 2) colors.insert(image.pixel(x, y));
  return colors.size();
}

View small_view(ViewKind kind, std::vector<int64_t> runs) {
  static const Trace trace = test::make_small_trace(5);
  ViewOptions options;
  options.runs = std::move(runs);
  options.layer = 1;
  return build_view(trace, kind, options);
}

}  // namespace

TEST_CASE("PNG export has the figure's size at the scale and is not blank", "[ui][export]") {
  const std::string dir = test::make_temp_dir("export");
  for (const ViewKind kind : {ViewKind::Heads, ViewKind::Predicted, ViewKind::Retention,
                              ViewKind::Consensus, ViewKind::Logits}) {
    const View view = small_view(kind, {0, 1});
    const std::string path = dir + "/" + view_name(kind) + ".png";
    export_figure(view.figure, path, 1.5);
    const std::string bytes = read_file(path);
    REQUIRE(bytes.substr(0, 8) == "\x89PNG\r\n\x1a\n");
    QImage image;
    REQUIRE(image.load(QString::fromStdString(path), "PNG"));
    CHECK(image.width() == int(std::ceil(view.figure.width * 1.5)));
    CHECK(image.height() == int(std::ceil(view.figure.height * 1.5)));
    INFO(view_name(kind));
    CHECK(distinct_colors(image) > 20);
  }
}

TEST_CASE("SVG and PDF exports are vector documents with the figure's text", "[ui][export]") {
  const std::string dir = test::make_temp_dir("export");
  const View view = small_view(ViewKind::Consensus, {1});
  export_figure(view.figure, dir + "/c.svg");
  const std::string svg = read_file(dir + "/c.svg");
  QXmlStreamReader xml(QByteArray::fromStdString(svg));
  bool root_svg = false;
  int64_t text_elements = 0;
  while (!xml.atEnd()) {
    if (xml.readNext() == QXmlStreamReader::StartElement) {
      if (xml.name() == QStringLiteral("svg")) root_svg = true;
      if (xml.name() == QStringLiteral("text")) ++text_elements;
    }
  }
  CHECK_FALSE(xml.hasError());
  CHECK(root_svg);
  CHECK(text_elements > 5);  // labels stay text, not pixels
  CHECK(svg.find("Cross-head consensus") != std::string::npos);

  export_figure(view.figure, dir + "/c.pdf");
  const std::string pdf = read_file(dir + "/c.pdf");
  REQUIRE(pdf.substr(0, 5) == "%PDF-");
  CHECK(pdf.find("%%EOF") != std::string::npos);
  CHECK(pdf.find("/MediaBox") != std::string::npos);
  CHECK(pdf.find("/Font") != std::string::npos);  // text as text
}

TEST_CASE("exports differ between policies where the data differ", "[ui][export]") {
  const std::string dir = test::make_temp_dir("export");
  for (const ViewKind kind : {ViewKind::Heads, ViewKind::Retention, ViewKind::Logits}) {
    export_figure(small_view(kind, {0}).figure, dir + "/a.png", 1.0);
    export_figure(small_view(kind, {1}).figure, dir + "/b.png", 1.0);
    INFO(view_name(kind));
    CHECK(read_file(dir + "/a.png") != read_file(dir + "/b.png"));
  }
}

TEST_CASE("export errors name the path and leave what was there", "[ui][export]") {
  const std::string dir = test::make_temp_dir("export");
  const View view = small_view(ViewKind::Logits, {1});
  try {
    export_figure(view.figure, dir + "/figure.bmp");
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(std::string(error.what()).find("figure.bmp") != std::string::npos);
    CHECK(std::string(error.what()).find(".png, .svg or .pdf") != std::string::npos);
  }
  CHECK_THROWS_AS(export_figure(view.figure, dir + "/missing/dir/figure.png"), Error);
  CHECK_FALSE(fs::exists(dir + "/missing"));
  std::ofstream(dir + "/keep.png") << "old";
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  if (::geteuid() != 0) {  // root writes anyway
    CHECK_THROWS_AS(export_figure(view.figure, dir + "/keep.png"), Error);
    CHECK(read_file(dir + "/keep.png") == "old");
  }
  fs::permissions(dir, fs::perms::owner_all);
}

TEST_CASE("kvlens-cli figure exports every view of a .kvtrace with its data", "[ui][cli]") {
  const std::string dir = test::make_temp_dir("figure");
  save_trace(test::make_small_trace(5), dir + "/run.kvtrace");
  const std::string cli = test::cli_path() + " figure --trace " + dir + "/run.kvtrace";
  for (const char* view : {"heads", "predicted", "retention", "consensus", "logits", "history"}) {
    const std::string out = dir + "/" + view;
    const test::CommandResult result =
        test::run_command(cli + " --view " + view + " --runs dense,h2o --layer 1 --out " + out +
                          ".svg --data " + out + ".csv");
    INFO(view << ": " << result.err);
    REQUIRE(result.exit_code == 0);
    CHECK(read_file(out + ".svg").find("<svg") != std::string::npos);
    CHECK(read_file(out + ".csv").find('\n') != std::string::npos);
  }
  const test::CommandResult json = test::run_command(
      cli + " --view heads --detail --runs 1 --out " + dir + "/d.pdf --data " + dir + "/d.json");
  REQUIRE(json.exit_code == 0);
  CHECK(read_file(dir + "/d.json").find("\"columns\"") != std::string::npos);
  CHECK(read_file(dir + "/d.pdf").substr(0, 5) == "%PDF-");
}

TEST_CASE("kvlens-cli figure --view history draws a token's history and writes its states",
          "[ui][cli]") {
  const std::string dir = test::make_temp_dir("figure");
  save_trace(test::make_small_trace(5), dir + "/run.kvtrace");
  const std::string cli = test::cli_path() + " figure --trace " + dir + "/run.kvtrace";
  const test::CommandResult result = test::run_command(
      cli + " --view history --runs h2o,dense --per-head --layer 1 --head 0 --token 1" +
      " --highlight 2,3 --width 950 --out " + dir + "/h.png --data " + dir + "/h.csv");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.out.find("history view, 950x") != std::string::npos);
  QImage image(QString::fromStdString(dir + "/h.png"));
  REQUIRE_FALSE(image.isNull());
  CHECK(distinct_colors(image) > 8);
  // Token 1 under h2o's L1 H0 (head 2 of the small trace): seen at step 1 (its own), evicted at 2.
  const std::string csv = read_file(dir + "/h.csv");
  CHECK(csv.find("run,policy,token,text,step,state") == 0);
  CHECK(csv.find("1,h2o,1, The,2,evicted") != std::string::npos);
  CHECK(csv.find("0,dense,1, The,2,visible") != std::string::npos);
  // A focused token past the text, a searched token that is no position: one clear error each.
  const test::CommandResult bad_token =
      test::run_command(cli + " --view history --token 6 --out " + dir + "/x.png");
  CHECK(bad_token.exit_code == 1);
  CHECK(bad_token.err.find("focus_token") != std::string::npos);
  const test::CommandResult bad_highlight =
      test::run_command(cli + " --view history --highlight 2,x --out " + dir + "/x.png");
  CHECK(bad_highlight.exit_code == 1);
  CHECK(bad_highlight.err.find("--highlight") != std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/x.png"));
}

TEST_CASE("the retention diff's legend renders its minus sign", "[ui][export]") {
  // "A − B" with U+2212: the exported SVG carries the character (the font has it: the PNG's
  // text is drawn from the bundled DejaVu Sans).
  const std::string dir = test::make_temp_dir("figure");
  const View view = small_view(ViewKind::Retention, {1, 0});
  export_figure(view.figure, dir + "/r.svg");
  CHECK(read_file(dir + "/r.svg").find("A \u2212 B") != std::string::npos);
}

TEST_CASE("kvlens-cli figure reports bad input in one line", "[ui][cli]") {
  const std::string dir = test::make_temp_dir("figure");
  save_trace(test::make_small_trace(3), dir + "/run.kvtrace");
  std::ofstream(dir + "/bad.kvtrace") << "KVTRACE but not really";
  const std::string cli = test::cli_path() + " figure ";
  struct Case {
    std::string args;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"--trace " + dir + "/none.kvtrace --out " + dir + "/f.png", {"none.kvtrace"}},
      {"--trace " + dir + "/bad.kvtrace --out " + dir + "/f.png", {"bad.kvtrace"}},
      {"--trace " + dir + "/run.kvtrace --view attention --out " + dir + "/f.png",
       {"view", "heads, predicted"}},
      {"--trace " + dir + "/run.kvtrace --runs quest --out " + dir + "/f.png",
       {"--runs", "0 dense, 1 h2o", "'quest'"}},
      {"--trace " + dir + "/run.kvtrace --step 3 --out " + dir + "/f.png", {"step", "[0, 3)"}},
      {"--trace " + dir + "/run.kvtrace --out " + dir + "/f.gif", {"f.gif", ".png, .svg or .pdf"}},
      {"--trace " + dir + "/run.kvtrace --out " + dir + "/f.png --data " + dir + "/d.txt",
       {"--data", ".csv or .json"}},
      {"--trace " + dir + "/run.kvtrace --quantity energy --out " + dir + "/f.png",
       {"--quantity", "'energy'"}},
  };
  for (const Case& c : cases) {
    const test::CommandResult result = test::run_command(cli + c.args);
    INFO(c.args << "\nstderr: " << result.err);
    CHECK(result.exit_code == 1);
    CHECK(result.err.find("kvlens-cli: error:") != std::string::npos);
    for (const std::string& part : c.parts) CHECK(result.err.find(part) != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir + "/f.png"));
  CHECK_FALSE(fs::exists(dir + "/f.gif"));
}

TEST_CASE("kvlens-cli figure fills a --height and highlights --highlight tokens", "[ui][cli]") {
  const std::string dir = test::make_temp_dir("figure");
  save_trace(test::make_small_trace(5), dir + "/run.kvtrace");
  const std::string cli = test::cli_path() + " figure --trace " + dir +
                          "/run.kvtrace --view heads --runs 1 --width 1480 --scale 1 --out " + dir;
  REQUIRE(test::run_command(cli + "/free.png").exit_code == 0);
  REQUIRE(test::run_command(cli + "/short.png --height 320").exit_code == 0);
  REQUIRE(test::run_command(cli + "/found.png --height 320 --highlight 2,3").exit_code == 0);
  CHECK(QImage(QString::fromStdString(dir + "/free.png")).height() > 320);
  CHECK(QImage(QString::fromStdString(dir + "/short.png")).height() <= 320);
  CHECK(read_file(dir + "/found.png") != read_file(dir + "/short.png"));
}
