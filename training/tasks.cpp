#include "training/tasks.hpp"

#include "attnlab/error.hpp"

namespace attnlab::training {

Registry<TaskMaker>& task_registry() {
  static Registry<TaskMaker> registry("task");
  return registry;
}

std::unique_ptr<Task> make_task(std::string_view spec, std::size_t n) {
  Params p(spec, kTaskSpec);
  const TaskMaker& maker = task_registry().at(p.name(), "task '" + p.spec() + "'");
  if (n == 0) throw Error("task '" + p.spec() + "': N = 0: expected N >= 1");
  std::unique_ptr<Task> task = maker.make(p, n);
  p.check_all_used();
  return task;
}

std::vector<std::string> task_names() {
  return task_registry().names();
}

std::string task_usage() {
  std::string usage;
  const auto names = task_names();
  const auto makers = task_registry().makers();
  for (std::size_t i = 0; i < names.size(); ++i) {
    usage.append(i ? ", " : "").append(names[i]);
    if (*makers[i]->keys) usage.append("[:").append(makers[i]->keys).append("]");
  }
  return usage;
}

}  // namespace attnlab::training
