#include "common/cluster_spec.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace asyncps {

std::string ServerAddress::ToString() const {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::vector<ServerAddress> ServerAddress::Members() const {
  std::vector<ServerAddress> members = {ServerAddress{host, port, {}}};
  members.insert(members.end(), others.begin(), others.end());
  return members;
}

absl::StatusOr<std::vector<ServerAddress>> ParseServerList(
    absl::string_view list) {
  std::vector<ServerAddress> out;
  if (absl::StripAsciiWhitespace(list).empty()) {
    return absl::InvalidArgumentError("server list is empty");
  }
  absl::flat_hash_set<std::string> seen;
  for (absl::string_view group : absl::StrSplit(list, ',')) {
    bool first = true;
    for (absl::string_view entry : absl::StrSplit(group, '|')) {
      entry = absl::StripAsciiWhitespace(entry);
      auto bad = [&](absl::string_view why) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad server '", entry, "': ", why));
      };
      if (entry.empty()) return bad("empty entry");
      ServerAddress addr;
      absl::string_view port;
      if (entry.front() == '[') {
        const size_t close = entry.find(']');
        if (close == absl::string_view::npos || close + 1 >= entry.size() ||
            entry[close + 1] != ':') {
          return bad("want [ipv6]:port");
        }
        addr.host = std::string(entry.substr(1, close - 1));
        port = entry.substr(close + 2);
      } else {
        const size_t colon = entry.rfind(':');
        if (colon == absl::string_view::npos) return bad("missing :port");
        addr.host = std::string(entry.substr(0, colon));
        if (addr.host.find(':') != std::string::npos) {
          return bad("bracket IPv6 hosts, as in [::1]:5000");
        }
        port = entry.substr(colon + 1);
      }
      if (addr.host.empty()) return bad("missing host");
      if (!absl::SimpleAtoi(port, &addr.port) || addr.port < 1 ||
          addr.port > 65535) {
        return bad("port must be a number in 1-65535");
      }
      if (!seen.insert(addr.ToString()).second) return bad("listed twice");
      if (first) {
        out.push_back(std::move(addr));
      } else {
        out.back().others.push_back(std::move(addr));
      }
      first = false;
    }
  }
  return out;
}

}  // namespace asyncps
