// AtomicOutputFile (output_file.h).
#include "app/session/output_file.h"

#include <cstdio>
#include <utility>

#include "engine/common/error.h"

namespace kvlens::session {

AtomicOutputFile::AtomicOutputFile(std::string path, std::string flag)
    : path_(std::move(path)), flag_(std::move(flag)), partial_(path_ + ".partial") {
  out_.open(partial_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error(path_, flag_, "a writable file");
}

AtomicOutputFile::~AtomicOutputFile() {
  if (committed_) return;
  out_.close();
  std::remove(partial_.c_str());
}

void AtomicOutputFile::commit() {
  out_.close();
  if (!out_) throw Error(path_, flag_, "a file the output could be written to");
  if (std::rename(partial_.c_str(), path_.c_str()) != 0) {
    throw Error(path_, flag_, "a path the output could be moved to");
  }
  committed_ = true;
}

}  // namespace kvlens::session
