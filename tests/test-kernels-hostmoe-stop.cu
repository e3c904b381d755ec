// tests/test-kernels-hostmoe-stop.cu - a host-expert session (cuda/host_moe.h, issue 16) whose
// poll thread was armed for requests that never come (a decode step that failed after arming)
// is freed at once: the poll thread watches the session's stop flag while it waits out its count
// (before, it spun or polled for up to 100 ms before it saw the destructor's stop).
// Needs the GPU (pinned memory, the mailbox) and the tiny checkpoint ($GPTOSS_TINY_MODEL).
#include "tests/kernel-test-util.cuh"

#include "cuda/host_moe.h"

#include <chrono>
#include <memory>
#include <thread>

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("host-expert session: freed within milliseconds while its poll thread waits for armed requests") {
    const char* dir = tiny_dir();
    std::unique_ptr<Checkpoint> ck;
    OK(load_checkpoint(dir, {}, &ck));
    cuda::HostExperts experts;
    OK(experts.init(ck->config, 1));
    experts.fill_random(1);
    for (int round = 0; round < 3; round++) {
        auto session = std::make_unique<cuda::HostMoeSession>();
        OK(session->init(&experts, ck->config));
        if (!session->polling()) {
            MESSAGE("GPTOSS_HOST_MOE_TRIP=callback: no poll thread, nothing to test");
            return;
        }
        session->arm(5);  // five requests announced, none will come
        std::this_thread::sleep_for(std::chrono::milliseconds(round == 2 ? 4 : 1));  // spinning, or polling slowly
        const auto t0 = std::chrono::steady_clock::now();
        session.reset();
        const double ms = ms_since(t0);
        INFO("round " << round << ": freed in " << ms << " ms");
        CHECK(ms < 20.0);  // the give-up time alone is 100 ms
    }
}
int main(int argc, char** argv) { return run_kernel_tests(argc, argv, "the host-expert session stop test (test-kernels-hostmoe-stop)"); }
