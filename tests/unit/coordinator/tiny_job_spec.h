// The coordinator tests' job: a 2-layer, d_model-64 Llama at world 2 with
// micro-batch 2 and sequence length 16; each test sets its name, steps and
// whatever else it needs on top.
#ifndef TANDEM_TESTS_UNIT_COORDINATOR_TINY_JOB_SPEC_H_
#define TANDEM_TESTS_UNIT_COORDINATOR_TINY_JOB_SPEC_H_

#include <cstdint>
#include <string>

#include "tandem/v1/job.pb.h"

namespace tandem {

inline v1::JobSpec TinyJobSpec(const std::string& name, int64_t steps,
                               int32_t world = 2) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_preset("llama");
  spec.mutable_model()->set_layers(2);
  spec.mutable_model()->set_d_model(64);
  spec.mutable_model()->set_heads(4);
  spec.mutable_model()->set_ffn(128);
  spec.mutable_model()->set_vocab(256);
  spec.mutable_batch()->set_micro_batch(2);
  spec.mutable_batch()->set_seq_len(16);
  spec.mutable_train()->set_steps(steps);
  spec.mutable_parallel()->set_world_size(world);
  return spec;
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_COORDINATOR_TINY_JOB_SPEC_H_
