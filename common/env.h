// Env: the operating-system seams a server runs against (time and files),
// passed down from main so that tests can substitute each one.
#ifndef ASYNCPS_COMMON_ENV_H_
#define ASYNCPS_COMMON_ENV_H_

#include "common/clock.h"
#include "common/file_system.h"

namespace asyncps {

// Borrowed pointers; both must outlive whatever the Env is given to.
struct Env {
  Clock* clock = Clock::Real();
  FileSystem* fs = FileSystem::Default();
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_ENV_H_
