// Output files of both front ends (kvlens-cli's --out/--json/--csv/--data, the app's data
// export): written under a temporary name and renamed into place once complete.
#pragma once

#include <fstream>
#include <string>

namespace kvlens::session {

// An output file written under a temporary name ("<path>.partial") and renamed into place by
// commit(), so a failed run never leaves half a file behind. Created by the constructor: an
// unwritable path fails before a long run rather than after it.
class AtomicOutputFile {
 public:
  // Throws kvlens::Error naming `path` and `flag` (the option that gave it) when it cannot be
  // created.
  AtomicOutputFile(std::string path, std::string flag);
  ~AtomicOutputFile();  // removes the temporary file unless commit() succeeded
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  std::ostream& stream() { return out_; }
  // Flushes, closes and renames; throws kvlens::Error when the data could not be written or
  // moved (the destructor then removes the temporary file).
  void commit();

 private:
  std::string path_, flag_, partial_;
  std::ofstream out_;
  bool committed_ = false;
};

}  // namespace kvlens::session
