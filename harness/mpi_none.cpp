// harness/mpi.hpp for a build without MPI.
#include "harness/mpi.hpp"

#include "attnlab/error.hpp"

namespace attnlab::harness::mpi {
namespace {
[[noreturn]] void missing() {
  throw Error(
      "--mpi: this attnlab was built without MPI (install libopenmpi-dev and reconfigure "
      "with -Dmpi=enabled)");
}
}  // namespace

bool available() {
  return false;
}
void init() {
  missing();
}
void finalize() {}
void abort(int) {}
int rank() {
  return 0;
}
int size() {
  return 1;
}
void broadcast(std::string&) {
  missing();
}
void send_row(const std::string&) {
  missing();
}
void send_done() {
  missing();
}
bool receive(std::string&, bool&, bool) {
  missing();
}
void barrier() {
  missing();
}

}  // namespace attnlab::harness::mpi
