// Program IR: what a client traces. Location-agnostic: nodes name virtual slices, not devices.
//
// One node per sharded computation (a compiled function bound to a slice), however many shards
// it has. Values are node outputs or program arguments; every value is a global array with a
// sharding over its slice's device mesh.
#pragma once

#include <string>
#include <vector>

#include "pw/base/ids.h"
#include "pw/base/shape.h"
#include "pw/base/sharding.h"

namespace pw {

// A value: output `index` of node `node`, or program argument `index` when node == kArgNode.
struct ValueRef {
  static constexpr int kArgNode = -1;
  int node = kArgNode;
  int index = 0;
  friend bool operator==(const ValueRef&, const ValueRef&) = default;
};

// A compiled function bound to a virtual slice, with the global layout of its inputs and outputs.
struct Binding {
  FunctionId function;
  SliceId slice;
  std::vector<ArraySpec> in_global;
  std::vector<Sharding> in_sharding;
  std::vector<ArraySpec> out_global;
  std::vector<Sharding> out_sharding;
};

struct ProgramNode {
  std::string name;
  Binding binding;
  std::vector<ValueRef> inputs;
};

struct ProgramIr {
  std::string name;
  std::vector<ArraySpec> args;  // Global spec of each argument.
  std::vector<ProgramNode> nodes;
  std::vector<ValueRef> outputs;
};

}  // namespace pw
