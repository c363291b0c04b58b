// The main() of the fuzz targets when they are not built with libFuzzer: runs
// LLVMFuzzerTestOneInput once over every file named on the command line or
// found (recursively) in a directory named there, so the seed corpora and the
// regression inputs run in every ordinary `./run test`.
//
// Exit status 0 when every input ran (a property violation aborts the
// process, naming the input on stderr first); 1 when an argument does not
// exist or a file cannot be read; a missing directory is an error too, so a
// renamed corpus cannot silently turn the test into a no-op.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool ReadAll(const std::filesystem::path& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    fs::path arg(argv[i]);
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      for (const auto& entry : fs::recursive_directory_iterator(arg, ec)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      if (ec) {
        std::cerr << "cannot list " << arg << ": " << ec.message() << "\n";
        return 1;
      }
    } else if (fs::is_regular_file(arg, ec)) {
      files.push_back(arg);
    } else {
      std::cerr << "no such file or directory: " << arg << "\n";
      return 1;
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::string bytes;
    if (!ReadAll(file, &bytes)) {
      std::cerr << "cannot read " << file << "\n";
      return 1;
    }
    std::cerr << "running " << file.string() << " (" << bytes.size() << " bytes)\n";
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::cerr << "ran " << files.size() << " inputs\n";
  return 0;
}
