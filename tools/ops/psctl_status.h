// What psctl prints from the shards' Stats: the status screen (shards,
// workers, embedding tables, replica groups) and the CSV of the histogram
// and workers commands. Output only, to stdout; nothing here calls a
// shard except PrintGroups, which asks each group member for its own Stats.
#ifndef ASYNCPS_TOOLS_OPS_PSCTL_STATUS_H_
#define ASYNCPS_TOOLS_OPS_PSCTL_STATUS_H_

#include <cstdint>
#include <vector>

#include "client/admin_client.h"
#include "client/shard_caller.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// One worker as psctl status shows it: the freshest report of any shard,
// its steps a second since `previous` (-1 on the first refresh, or when
// shard 0 restarted between them), and how many steps it is behind the
// furthest worker (its lag).
struct WorkerRow {
  v1::WorkerInfo info;
  double steps_per_second = -1;
  int64_t lag = 0;
};
std::vector<WorkerRow> WorkerRows(
    const std::vector<v1::StatsResponse>& stats,
    const std::vector<v1::StatsResponse>& previous);

// psctl status: every shard and every worker on one screen. `previous`
// (may be empty) is the last refresh's answer, for rates.
void PrintStatus(const std::vector<v1::StatsResponse>& stats,
                 const std::vector<v1::StatsResponse>& previous);

// psctl status, replicated shards (--servers=a|b,...): each group's
// members as each member sees itself. Prints nothing if no shard has a
// backup.
void PrintGroups(AdminClient* admin, ShardCaller* caller);

// psctl histogram: the staleness histogram summed over the shards, as CSV
// "staleness,count".
void PrintHistogram(const std::vector<v1::StatsResponse>& stats);

// psctl workers: every shard's view of every worker, as CSV
// "shard,rank,clock,live,seconds_since_heard".
void PrintWorkers(const std::vector<v1::StatsResponse>& stats);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_OPS_PSCTL_STATUS_H_
