# gptoss front door. Everything goes through CMake; this file only sequences it.
#   make        install missing Debian packages, fetch the tokenizer, build everything
#   make test   build, then run every test (what .ci/run does)
#   make chat   build, then start gptoss-chat (ARGS="--model DIR ..." to pass options)
BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_CLANG ?= build-clang
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps tokenizer-data configure test test-main test-asan test-clang chat clean

all: deps tokenizer-data configure
	cmake --build $(BUILD) -j$(JOBS)

deps:
	@bash tools/install-deps.sh

tokenizer-data:
	@bash tools/fetch-tokenizer.sh

configure:
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

test: all
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-clang

# The C++ unit tests again, CPU only, under AddressSanitizer + UBSan (leaks fail the run).
test-asan: deps tokenizer-data
	@test -f $(BUILD_ASAN)/CMakeCache.txt || cmake -S . -B $(BUILD_ASAN) $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DCMAKE_C_FLAGS_DEBUG="-g -O1" \
	    -DGPTOSS_CUDA=OFF -DGPTOSS_SANITIZE=address,undefined $(CMAKE_ARGS)
	cmake --build $(BUILD_ASAN) -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    ctest --test-dir $(BUILD_ASAN) --output-on-failure -L unit -j$(JOBS)

# The C/C++ code (CPU backend) built with clang as well, warnings as errors, and its unit tests.
test-clang: deps tokenizer-data
	@test -f $(BUILD_CLANG)/CMakeCache.txt || cmake -S . -B $(BUILD_CLANG) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DGPTOSS_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD_CLANG) -j$(JOBS)
	ctest --test-dir $(BUILD_CLANG) --output-on-failure -L unit -j$(JOBS)

chat: all
	$(BUILD)/gptoss-chat $(ARGS)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_CLANG)
