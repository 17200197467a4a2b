#include "worker/metrics/worker_metrics.h"

#include <string>
#include <vector>

#include "common/metrics/metrics_registry.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(WorkerMetricsTest, OnIteration_ExportsSeriesLabelledByJobAndRank) {
  metrics::Registry registry;
  auto m = WorkerMetrics::Create(registry);
  ASSERT_TRUE(m.ok()) << m.status();
  IterationReport ignored;
  ignored.tokens = 1;
  (*m)->OnIteration(ignored);  // before OnStart: dropped
  (*m)->OnStart("job-1", 1, 2);
  IterationReport r;
  r.step = 4;
  r.loss = 2.5;
  r.iteration_s = 0.5;
  r.compute_s = 0.3;
  r.communication_s = 0.4;
  r.exposed_communication_s = 0.1;
  r.tokens = 1000;
  r.allocated_bytes = 10;
  r.peak_bytes = 20;
  r.budget_bytes = 40;
  r.gathered_param_bytes = 8;
  r.persistent_param_bytes = 4;
  r.sharded_param_bytes = 2;
  r.schedule_version = 3;
  r.collective_bytes = {100, 50, 0};
  (*m)->OnIteration(r);
  (*m)->OnIteration(r);
  const std::string text = registry.Expose();
  const std::string l = R"(job="job-1",rank="1")";
  for (const std::string& line : std::vector<std::string>{
           std::string("# TYPE tandem_worker_iteration_seconds histogram"),
           "tandem_worker_iteration_seconds_count{" + l + "} 2",
           "tandem_worker_iteration_seconds_sum{" + l + "} 1",
           "tandem_worker_compute_seconds_sum{" + l + "} 0.6",
           "tandem_worker_communication_seconds_sum{" + l + "} 0.8",
           "tandem_worker_exposed_communication_seconds_sum{" + l + "} 0.2",
           "tandem_worker_overlap_ratio{" + l + "} 0.75",
           "tandem_worker_tokens_per_second{" + l + "} 2000",
           "tandem_worker_tokens_total{" + l + "} 2000",
           "tandem_worker_iterations_total{" + l + "} 2",
           "tandem_worker_loss{" + l + "} 2.5",
           "tandem_worker_step{" + l + "} 4",
           "tandem_worker_memory_bytes{" + l + R"(,kind="peak"} 20)",
           "tandem_worker_memory_bytes{" + l + R"(,kind="budget"} 40)",
           "tandem_worker_memory_bytes{" + l + R"(,kind="offloaded"} 0)",
           "tandem_worker_param_bytes{" + l + R"(,kind="gathered"} 8)",
           "tandem_worker_param_bytes{" + l + R"(,kind="persistent"} 4)",
           "tandem_worker_schedule_version{" + l + "} 3",
           "tandem_worker_collective_bytes_total{" + l +
               R"(,op="allgather"} 200)",
           "tandem_worker_collective_bytes_total{" + l +
               R"(,op="reduce_scatter"} 100)",
           "tandem_worker_collective_bytes_total{" + l +
               R"(,op="allreduce"} 0)",
           "tandem_worker_world_size{" + l + "} 2",
       }) {
    EXPECT_TRUE(Has(text, line)) << line << "\n" << text;
  }
  // No loss scaling: no scale series.
  EXPECT_EQ(text.find("tandem_worker_loss_scale{"), std::string::npos);
  EXPECT_EQ(text.find("tandem_worker_skipped_steps_total{"), std::string::npos);
  r.loss_scale = 65536;
  (*m)->OnIteration(r);
  r.loss_scale = 32768;
  r.skipped = true;
  (*m)->OnIteration(r);
  const std::string scaled = registry.Expose();
  EXPECT_TRUE(Has(scaled, "tandem_worker_loss_scale{" + l + "} 32768"))
      << scaled;
  EXPECT_TRUE(Has(scaled, "tandem_worker_skipped_steps_total{" + l + "} 1"))
      << scaled;
}

TEST(WorkerMetricsTest, Create_Twice_OnOneRegistry_Fails) {
  metrics::Registry registry;
  ASSERT_TRUE(WorkerMetrics::Create(registry).ok());
  EXPECT_FALSE(WorkerMetrics::Create(registry).ok());
}

}  // namespace
}  // namespace tandem
