# gptoss front door. Everything goes through CMake; this file only sequences it.
#   make        install missing Debian packages, fetch the tokenizer, build everything
#   make test   build, then run every test (what .ci/run does)
#   make chat   build, then start gptoss-chat (ARGS="--model DIR ..." to pass options)
# Each step depends on the one before (deps -> tokenizer-data -> configure -> build), so any
# `make -jN` runs them in order; tools/configure.sh configures again when a dependency appears.
BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_CLANG ?= build-clang
BUILD_FUZZ ?= build-fuzz
BUILD_TSAN ?= build-tsan
FUZZ_SECONDS ?= 15
FUZZ_RUN_SECONDS ?= 3600
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps tokenizer-data configure build test test-asan test-clang test-tsan fuzz fuzz-smoke fuzz-run chat clean

all: build

deps:
	@bash tools/install-deps.sh

tokenizer-data: deps
	@bash tools/fetch-tokenizer.sh

configure: tokenizer-data
	@bash tools/configure.sh $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-clang
	$(MAKE) --no-print-directory test-tsan
	$(MAKE) --no-print-directory fuzz-smoke

# The C++ unit tests again, CPU only, under AddressSanitizer + UBSan (leaks fail the run).
test-asan: tokenizer-data
	@bash tools/configure.sh $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DCMAKE_C_FLAGS_DEBUG="-g -O1" \
	    -DGPTOSS_CUDA=OFF -DGPTOSS_SANITIZE=address,undefined $(CMAKE_ARGS)
	cmake --build $(BUILD_ASAN) -j$(JOBS) --target unit-tests
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    ctest --test-dir $(BUILD_ASAN) --output-on-failure -L unit -j$(JOBS)

# The C/C++ code (CPU backend) built with clang as well, warnings as errors, and its unit tests.
test-clang: tokenizer-data
	@CC=clang CXX=clang++ bash tools/configure.sh $(BUILD_CLANG) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPTOSS_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD_CLANG) -j$(JOBS)
	ctest --test-dir $(BUILD_CLANG) --output-on-failure -L unit -j$(JOBS)

# Races: tests/test-threads.cpp (N sessions on one model in N threads) and tests/test-batch.cpp
# (the continuous batcher's rendezvous: sessions on threads sharing steps, joining and leaving)
# under ThreadSanitizer, CPU backend, clang. Only the library, the fixture's gptoss-synth and the
# tests are built.
test-tsan: tokenizer-data
	@CC=clang CXX=clang++ bash tools/configure.sh $(BUILD_TSAN) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
	    -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DGPTOSS_CUDA=OFF -DGPTOSS_SANITIZE=thread $(CMAKE_ARGS)
	cmake --build $(BUILD_TSAN) -j$(JOBS) --target gptoss-synth test-threads test-batch
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	    ctest --test-dir $(BUILD_TSAN) --output-on-failure -R '^(synth-tiny|test-threads|test-batch)$$'

# libFuzzer targets (tests/fuzz/README.md): clang, ASan + UBSan, the library and the fuzzers only.
fuzz: tokenizer-data
	@CC=clang CXX=clang++ bash tools/configure.sh $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
	    -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DGPTOSS_CUDA=OFF -DGPTOSS_SANITIZE=address,undefined -DGPTOSS_FUZZ=ON $(CMAKE_ARGS)
	cmake --build $(BUILD_FUZZ) -j$(JOBS) --target fuzz

# Every fuzzer for FUZZ_SECONDS each (part of make test), or FUZZ_RUN_SECONDS each (the long run).
fuzz-smoke: fuzz
	bash tests/fuzz/run.sh $(BUILD_FUZZ) $(FUZZ_SECONDS)

fuzz-run: fuzz
	bash tests/fuzz/run.sh $(BUILD_FUZZ) $(FUZZ_RUN_SECONDS)

chat: build
	$(BUILD)/gptoss-chat $(ARGS)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_CLANG) $(BUILD_TSAN) $(BUILD_FUZZ)
