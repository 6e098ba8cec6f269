#include "pw/program/lowering.h"

#include <algorithm>
#include <deque>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pw/base/status_macros.h"

namespace pw {

Placement PlacementOn(const SliceInfo& slice, const ArraySpec& global, const Sharding& sharding) {
  return Placement{slice.id, slice.devices, slice.hosts, slice.islands, global, sharding};
}

absl::Status CheckLayout(const std::string& where, const ArraySpec& global,
                         const Sharding& sharding, const ArraySpec& shard_spec,
                         const SliceInfo& slice) {
  PW_RETURN_IF_ERROR(Annotate(global.Validate(), where));
  PW_RETURN_IF_ERROR(Annotate(sharding.Validate(global.shape), where));
  if (sharding.num_devices() != static_cast<int>(slice.devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": sharding ", sharding.ToString(),
                                                   " covers ", sharding.num_devices(),
                                                   " devices but ", slice.id.ToString(),
                                                   " has ", slice.devices.size()));
  }
  ArraySpec shard{global.dtype, sharding.ShardShape(global.shape)};
  if (shard.dtype != shard_spec.dtype || shard.num_elements() != shard_spec.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", global.ToString(), " sharded ",
                                                   sharding.ToString(), " gives shards of ",
                                                   shard.ToString(), " but the function takes ",
                                                   shard_spec.ToString()));
  }
  return absl::OkStatus();
}

int LoweredProgram::num_compute() const {
  return static_cast<int>(std::count_if(nodes.begin(), nodes.end(), [](const LoweredNode& n) {
    return n.kind == LoweredNode::Kind::kCompute;
  }));
}
int LoweredProgram::num_transfers() const {
  return static_cast<int>(std::count_if(nodes.begin(), nodes.end(), [](const LoweredNode& n) {
    return n.kind == LoweredNode::Kind::kTransfer;
  }));
}

std::string LoweredProgram::ToString() const {
  auto vals = [](const std::vector<int>& v) {
    return absl::StrJoin(v, ",", [](std::string* out, int i) { absl::StrAppend(out, "v", i); });
  };
  std::string s = absl::StrCat("program '", name, "': ", nodes.size(), " nodes\n");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    switch (n.kind) {
      case LoweredNode::Kind::kArg:
        absl::StrAppend(&s, "  ", i, " Arg -> ", vals(n.outputs), "\n");
        break;
      case LoweredNode::Kind::kCompute:
        absl::StrAppend(&s, "  ", i, " Compute '", n.name, "' ", n.function.ToString(), " on ",
                        n.slice.slice.ToString(), " [", JoinIds(n.slice.devices),
                        "] ", vals(n.inputs), " -> ", vals(n.outputs), "\n");
        break;
      case LoweredNode::Kind::kTransfer:
        absl::StrAppend(&s, "  ", i, " Transfer (", LinkClassName(n.link), ") ", vals(n.inputs),
                        " -> ", vals(n.outputs), " on [", JoinIds(n.slice.devices),
                        "]\n");
        break;
      case LoweredNode::Kind::kResult:
        absl::StrAppend(&s, "  ", i, " Result <- ", vals(n.inputs), "\n");
        break;
    }
  }
  return s;
}

namespace {

std::string NodeName(const ProgramIr& ir, int i) {
  return ir.nodes[i].name.empty() ? absl::StrCat("#", i) : ir.nodes[i].name;
}

// Kahn's algorithm over node->node edges; on a cycle, names the nodes on it.
absl::StatusOr<std::vector<int>> TopoOrder(const ProgramIr& ir, const std::string& prog) {
  const int n = static_cast<int>(ir.nodes.size());
  std::vector<int> indeg(n, 0);
  std::vector<std::vector<int>> users(n);
  for (int i = 0; i < n; ++i) {
    for (size_t j = 0; j < ir.nodes[i].inputs.size(); ++j) {
      const ValueRef& r = ir.nodes[i].inputs[j];
      if (r.node == ValueRef::kArgNode) continue;
      if (r.node < 0 || r.node >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat(prog, " node '", NodeName(ir, i), "' input ", j, " refers to node ",
                         r.node, ", which does not exist (", n, " nodes)"));
      }
      indeg[i]++;
      users[r.node].push_back(i);
    }
  }
  std::deque<int> ready;
  for (int i = 0; i < n; ++i)
    if (indeg[i] == 0) ready.push_back(i);
  std::vector<int> order;
  while (!ready.empty()) {
    int i = ready.front();
    ready.pop_front();
    order.push_back(i);
    for (int u : users[i])
      if (--indeg[u] == 0) ready.push_back(u);
  }
  if (static_cast<int>(order.size()) == n) return order;
  // Walk back along inputs inside the unresolved set until a node repeats.
  int start = 0;
  while (indeg[start] == 0) ++start;
  std::vector<int> path;
  absl::flat_hash_map<int, size_t> seen;
  int cur = start;
  while (!seen.contains(cur)) {
    seen[cur] = path.size();
    path.push_back(cur);
    for (const ValueRef& r : ir.nodes[cur].inputs) {
      if (r.node != ValueRef::kArgNode && indeg[r.node] > 0) {
        cur = r.node;
        break;
      }
    }
  }
  std::vector<std::string> names;
  for (size_t k = seen[cur]; k < path.size(); ++k)
    names.push_back(absl::StrCat("'", NodeName(ir, path[k]), "'"));
  std::reverse(names.begin(), names.end());
  names.push_back(names.front());
  return absl::InvalidArgumentError(absl::StrCat(prog, " has a cycle: ",
                                                 absl::StrJoin(names, " -> ")));
}

}  // namespace

namespace {
// Fills LoweredNode::release and the peak of LoweredProgram::device_bytes.
void PlanReleases(LoweredProgram& p) {
  std::vector<int> last_reader(p.values.size(), -1);
  std::vector<bool> keep(p.values.size(), false);
  for (int v : p.outputs) keep[v] = true;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    for (int v : p.nodes[i].inputs) {
      if (p.nodes[i].kind == LoweredNode::Kind::kCompute) last_reader[v] = static_cast<int>(i);
      else keep[v] = true;
    }
  }
  absl::flat_hash_map<DeviceId, int64_t> live;
  auto add = [&](int v, int64_t sign) {
    const Placement& pl = *p.values[v].placement;
    for (DeviceId d : pl.devices) {
      int64_t& b = live[d];
      b += sign * pl.shard_bytes();
      p.device_bytes[d] = std::max(p.device_bytes[d], b);
    }
  };
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    LoweredNode& n = p.nodes[i];
    if (n.kind != LoweredNode::Kind::kCompute && n.kind != LoweredNode::Kind::kTransfer) continue;
    for (int v : n.outputs) add(v, +1);
    if (n.kind != LoweredNode::Kind::kCompute) continue;
    for (int v : n.inputs) {
      if (p.values[v].arg >= 0 || keep[v] || last_reader[v] != static_cast<int>(i) ||
          std::find(n.release.begin(), n.release.end(), v) != n.release.end())
        continue;
      n.release.push_back(v);
      add(v, -1);
    }
  }
}
}  // namespace

absl::StatusOr<LoweredProgram> Lower(const ProgramIr& ir, const std::vector<Placement>& args,
                                     const LoweringContext& ctx) {
  LoweredProgram out;
  out.name = ir.name.empty() ? "program" : ir.name;
  const std::string prog = absl::StrCat("program '", out.name, "'");
  if (args.size() != ir.args.size()) {
    return absl::InvalidArgumentError(absl::StrCat(prog, " takes ", ir.args.size(),
                                                   " arguments, got ", args.size()));
  }
  if (ir.nodes.empty()) return absl::InvalidArgumentError(absl::StrCat(prog, " has no nodes"));
  LoweredNode arg_node{LoweredNode::Kind::kArg, "args"};
  for (size_t i = 0; i < args.size(); ++i) {
    if (!(args[i].global == ir.args[i])) {
      return absl::InvalidArgumentError(absl::StrCat(prog, " argument ", i, " is ",
                                                     args[i].global.ToString(),
                                                     " but the program expects ",
                                                     ir.args[i].ToString()));
    }
    out.values.push_back({std::make_shared<const Placement>(args[i]), static_cast<int>(i)});
    arg_node.outputs.push_back(static_cast<int>(i));
  }
  out.nodes.push_back(std::move(arg_node));

  PW_ASSIGN_OR_RETURN(std::vector<int> order, TopoOrder(ir, prog));
  std::vector<std::vector<int>> node_values(ir.nodes.size());
  // (source value, destination layout) -> transferred value.
  absl::flat_hash_map<std::string, int> transfers;

  for (int i : order) {
    const ProgramNode& node = ir.nodes[i];
    const Binding& b = node.binding;
    const std::string where = absl::StrCat(prog, " node '", NodeName(ir, i), "'");
    auto slice = ctx.ResolveSlice(b.slice);
    if (!slice.ok()) return Annotate(slice.status(), where);
    auto sig = ctx.LoadSignature(b.function, static_cast<int>(slice->devices.size()));
    if (!sig.ok()) return Annotate(sig.status(), where);
    const auto& in_specs = sig->inputs;
    const auto& out_specs = sig->outputs;
    if (b.in_global.size() != in_specs.size() || b.in_sharding.size() != in_specs.size() ||
        node.inputs.size() != in_specs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": function '", sig->name, "' takes ", in_specs.size(),
          " inputs; the node has ", node.inputs.size(), " inputs and ", b.in_global.size(),
          " input layouts"));
    }
    if (b.out_global.size() != out_specs.size() || b.out_sharding.size() != out_specs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": function '", sig->name,
                                                     "' has ", out_specs.size(),
                                                     " outputs; the node declares ",
                                                     b.out_global.size()));
    }
    LoweredNode compute{LoweredNode::Kind::kCompute, NodeName(ir, i)};
    compute.function = b.function;
    compute.slice = PlacementOn(*slice, {}, Sharding());
    for (size_t j = 0; j < node.inputs.size(); ++j) {
      const std::string iwhere = absl::StrCat(where, " input ", j);
      PW_RETURN_IF_ERROR(CheckLayout(iwhere, b.in_global[j], b.in_sharding[j], in_specs[j], *slice));
      const ValueRef& r = node.inputs[j];
      int v;
      std::string from;
      if (r.node == ValueRef::kArgNode) {
        if (r.index < 0 || r.index >= static_cast<int>(args.size()))
          return absl::InvalidArgumentError(absl::StrCat(iwhere, " refers to argument ", r.index,
                                                         ", but the program has ", args.size()));
        v = r.index;
        from = absl::StrCat("argument ", r.index);
      } else {
        if (r.index < 0 || r.index >= static_cast<int>(node_values[r.node].size()))
          return absl::InvalidArgumentError(absl::StrCat(iwhere, " refers to output ", r.index,
                                                         " of node '", NodeName(ir, r.node),
                                                         "', which has ",
                                                         node_values[r.node].size()));
        v = node_values[r.node][r.index];
        from = absl::StrCat("node '", NodeName(ir, r.node), "' output ", r.index);
      }
      if (!(out.values[v].placement->global == b.in_global[j])) {
        return absl::InvalidArgumentError(absl::StrCat(iwhere, " expects ",
                                                       b.in_global[j].ToString(), ", but ", from,
                                                       " is ", out.values[v].placement->global.ToString()));
      }
      Placement want = PlacementOn(*slice, b.in_global[j], b.in_sharding[j]);
      if (!out.values[v].placement->SameLayout(want)) {
        std::string key = absl::StrCat(v, "|", JoinIds(want.devices), "|",
                                       want.sharding.ToString());
        auto it = transfers.find(key);
        if (it == transfers.end()) {
          const Placement& src = *out.values[v].placement;
          LoweredNode t{LoweredNode::Kind::kTransfer,
                        absl::StrCat("transfer to ", NodeName(ir, i), " input ", j)};
          absl::flat_hash_set<int64_t> islands;
          for (IslandId x : src.islands) islands.insert(x.value());
          for (IslandId x : want.islands) islands.insert(x.value());
          t.link = islands.size() > 1 ? LinkClass::kDcn : LinkClass::kIci;
          t.slice = want;
          t.inputs = {v};
          int nv = static_cast<int>(out.values.size());
          out.values.push_back({std::make_shared<const Placement>(want), -1});
          t.outputs = {nv};
          out.nodes.push_back(std::move(t));
          it = transfers.emplace(key, nv).first;
        }
        v = it->second;
      }
      compute.inputs.push_back(v);
    }
    for (size_t k = 0; k < out_specs.size(); ++k) {
      const std::string owhere = absl::StrCat(where, " output ", k);
      PW_RETURN_IF_ERROR(CheckLayout(owhere, b.out_global[k], b.out_sharding[k], out_specs[k], *slice));
      int nv = static_cast<int>(out.values.size());
      out.values.push_back(
          {std::make_shared<const Placement>(PlacementOn(*slice, b.out_global[k], b.out_sharding[k])), -1});
      compute.outputs.push_back(nv);
      node_values[i].push_back(nv);
    }
    out.nodes.push_back(std::move(compute));
  }

  if (ir.outputs.empty()) return absl::InvalidArgumentError(absl::StrCat(prog, " has no outputs"));
  LoweredNode result{LoweredNode::Kind::kResult, "result"};
  for (size_t o = 0; o < ir.outputs.size(); ++o) {
    const ValueRef& r = ir.outputs[o];
    int v = -1;
    if (r.node == ValueRef::kArgNode) {
      if (r.index >= 0 && r.index < static_cast<int>(args.size())) v = r.index;
    } else if (r.node >= 0 && r.node < static_cast<int>(ir.nodes.size()) && r.index >= 0 &&
               r.index < static_cast<int>(node_values[r.node].size())) {
      v = node_values[r.node][r.index];
    }
    if (v < 0)
      return absl::InvalidArgumentError(
          absl::StrCat(prog, " output ", o, " refers to a value that does not exist"));
    if (out.values[v].arg >= 0)
      return absl::InvalidArgumentError(absl::StrCat(
          prog, " output ", o, " returns argument ", out.values[v].arg,
          " unchanged; return a computed value (the caller already holds the argument)"));
    result.inputs.push_back(v);
    out.outputs.push_back(v);
  }
  out.nodes.push_back(std::move(result));
  PlanReleases(out);
  return out;
}

}  // namespace pw
