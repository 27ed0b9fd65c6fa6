#include "harness/mpi.hpp"

#define OMPI_SKIP_MPICXX 1  // the C API is all we use
#include <mpi.h>

#include <vector>

#include "attnlab/error.hpp"

namespace attnlab::harness::mpi {
namespace {
constexpr int kRowTag = 1, kDoneTag = 2;
}

bool available() {
  return true;
}

void init() {
  int ready = 0;
  MPI_Initialized(&ready);
  if (!ready && MPI_Init(nullptr, nullptr) != MPI_SUCCESS) throw Error("MPI_Init failed");
}

void finalize() {
  int ready = 0, done = 0;
  MPI_Initialized(&ready);
  MPI_Finalized(&done);
  if (ready && !done) MPI_Finalize();
}

void abort(int code) {
  int ready = 0, done = 0;
  MPI_Initialized(&ready);
  MPI_Finalized(&done);
  if (ready && !done) MPI_Abort(MPI_COMM_WORLD, code);
}

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

void broadcast(std::string& text) {
  unsigned long long n = text.size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  text.resize(n);
  if (n) MPI_Bcast(text.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
}

void send_row(const std::string& line) {
  MPI_Send(line.data(), static_cast<int>(line.size()), MPI_CHAR, 0, kRowTag, MPI_COMM_WORLD);
}

void send_done() {
  MPI_Send(nullptr, 0, MPI_CHAR, 0, kDoneTag, MPI_COMM_WORLD);
}

bool receive(std::string& line, bool& done, bool block) {
  MPI_Status status;
  int pending = 1;
  if (block)
    MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &status);
  else
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &pending, &status);
  if (!pending) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_CHAR, &count);
  std::vector<char> buf(static_cast<std::size_t>(count));
  MPI_Recv(buf.data(), count, MPI_CHAR, status.MPI_SOURCE, status.MPI_TAG, MPI_COMM_WORLD,
           MPI_STATUS_IGNORE);
  line.assign(buf.begin(), buf.end());
  done = status.MPI_TAG == kDoneTag;
  return true;
}

void barrier() {
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace attnlab::harness::mpi
