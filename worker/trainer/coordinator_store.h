// A c10d::Store backed by the coordinator's rendezvous key-value store, so a
// worker in agent mode needs nothing but the coordinator's address to
// bootstrap Gloo or NCCL. Every key is prefixed with the job's store prefix.
//
// c10d calls these from its own threads and expects exceptions on failure:
// errors from the coordinator become c10::Error with the coordinator's
// message. get() and wait() block up to the store's timeout.
#ifndef TANDEM_WORKER_TRAINER_COORDINATOR_STORE_H_
#define TANDEM_WORKER_TRAINER_COORDINATOR_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "torch/csrc/distributed/c10d/Store.hpp"
#include "worker/agent/coordinator_client.h"

namespace tandem {

class CoordinatorStore : public c10d::Store {
 public:
  // `client` must outlive the store.
  CoordinatorStore(CoordinatorClient* client, std::string prefix,
                   std::chrono::milliseconds timeout = kDefaultTimeout);

  // Another store over the same client and prefix. Overrides
  // c10d::Store::clone where libtorch declares it (newer 2.x releases, which
  // hand clones to their own threads); a plain method before that.
  c10::intrusive_ptr<c10d::Store> clone();

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key,
                                  const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + key; }
  // The value of `key` once it is set, long-polling until `deadline` through
  // coordinator outages; throws "timed out after `timeout`" past it.
  std::string WaitFor(const std::string& key,
                      std::chrono::steady_clock::time_point deadline,
                      std::chrono::milliseconds timeout);

  CoordinatorClient* client_;
  const std::string prefix_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_TRAINER_COORDINATOR_STORE_H_
