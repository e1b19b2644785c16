// psctl export: the model and the embedding tables as the shards hold them
// now, read as a reader reads them (no step waits for it), into one file
// that numpy loads by name.
#ifndef ASYNCPS_TOOLS_OPS_PSCTL_EXPORT_H_
#define ASYNCPS_TOOLS_OPS_PSCTL_EXPORT_H_

#include <string>

#include "client/admin_client.h"
#include "client/ps_client.h"

namespace asyncps {

// psctl export --format=FORMAT --out=OUT: every tensor of the running
// model and every row of each embedding table, by name. Written to
// OUT.tmp, then renamed. Returns psctl's exit status: 0 on success, 2 for
// a bad FORMAT or an empty OUT, 1 if the shards cannot be read, hold
// nothing, or OUT cannot be written (each with its message on stderr).
int ExportCommand(PsClient* client, AdminClient* admin,
                  const std::string& format, const std::string& out);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_OPS_PSCTL_EXPORT_H_
