#include "storage/graph_meta.h"

#include <algorithm>
#include <stdexcept>

#include "storage/json_numbers.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

using json = nlohmann::json;

std::string brief(const json& j) {
  std::string s = j.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

GraphSpec spec_from(const json& j) {
  GraphSpec s;
  s.dtype = j.at("dtype").get<std::string>();
  s.sizes = json_ints<int64_t>(j.at("sizes"));
  s.strides = json_ints<int64_t>(j.at("strides"));
  if (s.sizes.size() != s.strides.size())
    throw std::invalid_argument("sizes and strides differ in rank");
  s.device = j.at("device").get<std::string>();
  s.requires_grad = j.at("requires_grad").get<bool>();
  return s;
}

GraphObservation observation_from(const json& jo) {
  GraphObservation o;
  const bool failed = jo.contains("error");
  if (jo.contains("read")) {
    o.kind = GraphObservation::Kind::Read;
    o.call = jo.at("read").get<std::string>();
    o.key = jo.at("key").get<std::string>();
    if (!failed) o.spec = spec_from(jo.at("spec"));
  } else if (jo.contains("query")) {
    o.kind = GraphObservation::Kind::Query;
    o.call = jo.at("query").get<std::string>();
    o.key = jo.at("key").get<std::string>();
    if (!failed) o.answer = jo.at("answer");
    if (jo.contains("exclude")) o.exclude = jo.at("exclude").get<std::vector<std::string>>();
    if (!std::is_sorted(o.exclude.begin(), o.exclude.end()))
      throw std::invalid_argument("exclude is not sorted");
  } else if (jo.contains("lazy")) {
    o.kind = GraphObservation::Kind::Lazy;
    o.key = jo.at("lazy").get<std::string>();
    o.deps = jo.at("deps").get<std::vector<std::string>>();
    o.version = jo.at("version").get<std::string>();
    if (!failed) o.answer = jo.at("answer").get<bool>();
  } else {
    throw std::invalid_argument("observation " + brief(jo) + " has no read, query or lazy field");
  }
  if (failed)
    o.error = std::pair(jo.at("error").at("kind").get<std::string>(),
                        jo.at("error").at("message").get<std::string>());
  return o;
}

}  // namespace

GraphMeta parse_graph_meta(const json& j) {
  GraphMeta m;
  try {
    m.prefix = j.at("prefix").get<std::string>();
    for (const auto& jo : j.at("observations")) m.observations.push_back(observation_from(jo));
    for (const auto& s : j.at("inputs")) m.inputs.push_back(spec_from(s));
    m.grad_mode = j.at("grad_mode").get<bool>();
    m.dynamic_dim0 = j.contains("dynamic_dim0") && j.at("dynamic_dim0").get<bool>();
    if (j.contains("ambient")) m.ambient = j.at("ambient").get<std::string>();
    if (j.contains("context")) m.context = j.at("context").get<std::string>();
    const json& je = j.at("effects");
    m.erases = je.at("erases").get<std::vector<std::string>>();
    m.writes = je.at("writes").get<std::vector<std::string>>();
    for (const auto& l : je.at("lazy_writes"))
      m.lazy_writes.push_back({l.at("key").get<std::string>(),
                               l.at("deps").get<std::vector<std::string>>(),
                               l.at("version").get<std::string>()});
    m.lazy_reuses = json_int(je.at("lazy_reuses"));
    if (je.contains("structure")) {
      m.structure = je.at("structure").get<std::string>();
      m.returns = json_int(je.at("returns"));
      if (m.returns < 0 || m.returns > (int64_t{1} << 20))
        throw std::invalid_argument(std::to_string(m.returns) + " returned tensors");
    } else {
      m.returns = je.at("returns").get<bool>() ? 1 : 0;
    }
  } catch (const json::exception& e) {
    throw CorruptionError(std::string("guard record: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw CorruptionError(std::string("guard record: ") + e.what());
  }
  return m;
}

}  // namespace tdstore::storage
