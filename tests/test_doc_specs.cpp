// The factory strings the docs show are ones make_attention accepts: every spec written in the
// README, docs/*.md and the Python package's sources (docstrings included) is parsed, so an
// example such as "sliding:window=64" (no such key) fails here instead of in a reader's hands.
// The README's table of variants lists exactly the registered names, each with its canonical
// spec of defaults.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "attnlab/attnlab.hpp"
#include "harness/config.hpp"

namespace fs = std::filesystem;
using namespace attnlab;

namespace {

const fs::path kSource = ATTNLAB_SOURCE_DIR;

// Specs the docs show on purpose as bad input, each with what its error must name: they must
// keep failing, so the example stays an example of an error.
const std::map<std::string, std::string> kDeliberatelyBad = {
    {"full:window=3", "unknown key 'window'"},
};

std::string read(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<fs::path> documented_files() {
  std::vector<fs::path> files{kSource / "README.md"};
  for (const auto& dir : {kSource / "docs", kSource / "python" / "attnlab"})
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string ext = entry.path().extension().string();
      if (ext == ".md" || ext == ".py" || ext == ".cpp") files.push_back(entry.path());
    }
  std::sort(files.begin(), files.end());
  return files;
}

// Every text a reader would copy as a spec: `code spans`, "double" and 'single' quoted strings,
// and the argument of --spec or --variant. A candidate is a spec when it is a registered name,
// alone or followed by ':'; anything else (a task "mqar:pairs=4", "linear+short-conv", prose)
// is not one.
std::set<std::string> specs_in(const std::string& text) {
  static const std::vector<std::regex> quoted{
      std::regex("`([^`\n]+)`"), std::regex("\"([^\"\n]+)\""), std::regex("'([^'\n]+)'"),
      std::regex("--(?:spec|variant)[ =]+([^\\s`'\"]+)")};
  const std::vector<std::string> names = attention_names();
  std::set<std::string> out;
  for (const std::regex& re : quoted)
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
         ++it) {
      const std::string candidate = (*it)[1].str();
      const std::string name = candidate.substr(0, candidate.find(':'));
      const bool spec_like = candidate.find(' ') == std::string::npos &&
                             std::find(names.begin(), names.end(), name) != names.end();
      if (spec_like) out.insert(candidate);
    }
  return out;
}

}  // namespace

TEST_CASE("every factory string in the docs and docstrings is one make_attention accepts",
          "[docs]") {
  std::size_t checked = 0;
  std::set<std::string> bad_seen;
  for (const fs::path& file : documented_files()) {
    for (const std::string& spec : specs_in(read(file))) {
      INFO(file.lexically_relative(kSource).string() << ": " << spec);
      if (kDeliberatelyBad.count(spec)) {
        bad_seen.insert(spec);
        continue;
      }
      // A model's cycle of layers' cores ("A;B", models::layer_specs) stands for each part; a
      // sweep pattern ("linformer:k=[64,128,256]") for each spec it expands to.
      std::stringstream parts(spec);
      for (std::string part; std::getline(parts, part, ';');) {
        const std::vector<std::string> specs = part.find('[') != std::string::npos
                                                   ? harness::expand_spec(part)
                                                   : std::vector<std::string>{part};
        for (const std::string& one : specs) {
          CHECK_NOTHROW(make_attention(one));
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 50);  // the README, the guides and the docstrings show specs: the scan found them
  for (const auto& [spec, fragment] : kDeliberatelyBad) {
    INFO(spec);
    CHECK(bad_seen.count(spec));  // still shown somewhere, else drop it from the list
    try {
      make_attention(spec);
      FAIL("a deliberately bad example was accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(fragment) != std::string::npos);
    }
  }
}

TEST_CASE("the README's table of variants lists every registered variant with its defaults",
          "[docs]") {
  const std::string readme = read(kSource / "README.md");
  const auto start = readme.find("\n## Variants\n");
  REQUIRE(start != std::string::npos);
  const std::string section = readme.substr(start, readme.find("\n## ", start + 1) - start);
  // | `name` | `spec with its defaults` | what it is |
  const std::regex row("\\n\\| `([^`]+)` \\| `([^`]+)` \\|");
  std::vector<std::string> listed;
  for (auto it = std::sregex_iterator(section.begin(), section.end(), row);
       it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1].str(), spec = (*it)[2].str();
    INFO(name << ": " << spec);
    listed.push_back(name);
    CHECK(make_attention(name)->spec() == spec);  // the defaults column is the canonical spec
  }
  CHECK(listed == attention_names());  // every variant, in the registry's order
}
