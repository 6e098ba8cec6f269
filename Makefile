# Contracts: `make build` -> build/ (CLI at build/bin/pw); `make test` runs every test; `make demo` runs the main job.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

FUZZ_DIR ?= build-fuzz
FUZZ_TARGETS = wire_fuzz cluster_spec_fuzz
FUZZ_SECONDS ?= 600

.PHONY: deps build python test demo asan tsan fuzz fuzz-build clean figures

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The Python package (nanobind extension built by scikit-build-core into build-python/), editable.
python: deps
	.venv/bin/pip install -q --no-build-isolation -e .

test: build python fuzz-build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)
	.venv/bin/python -m pytest -q python/tests
	FUZZ_DIR=$(FUZZ_DIR) scripts/fuzz.sh 25  # A short run of every fuzz target; `make fuzz`: longer.

# The README's pictures (docs/images/): benchmark plots, a Fig.-9 trace, the dashboard.
figures: build python
	scripts/figures.sh

# libFuzzer targets (clang, coverage + ASan/UBSan) in their own tree: only the targets are built.
fuzz-build: deps
	cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++-14 -DPW_FUZZ=ON -DPW_TESTS=OFF
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target $(FUZZ_TARGETS)

fuzz: fuzz-build
	FUZZ_DIR=$(FUZZ_DIR) scripts/fuzz.sh $(FUZZ_SECONDS)

# The main job: the paper's Figure 2 program, then the data-parallel MLP (examples/mlp_dp.py),
# on a `pw up` cluster of 2 islands x 2 hosts x 2 devices that scripts/demo.sh starts and stops.
demo: build python
	BUILD_DIR=$(BUILD_DIR) scripts/demo.sh

# Sanitizer builds: ASan+UBSan and TSan, each in its own build directory.
asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPW_SANITIZE=address
	cmake --build build-asan -j $(JOBS)
	cd build-asan && LSAN_OPTIONS="suppressions=$(CURDIR)/scripts/lsan.supp" ctest --output-on-failure -j $(JOBS)

tsan: deps
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPW_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS)
	# The prebuilt PJRT plugin and Debian's gRPC are not TSan-instrumented: their synchronization
	# is invisible to TSan (e.g. a Worker built on the main thread and used on the thread a gRPC
	# request reaches it through is reported), so the PJRT and gRPC cluster tests run in the other
	# builds only (ClientSessionMail serves a mock controller over gRPC). The shared-memory mailbox
	# (no gRPC) is checked here.
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/scripts/tsan.supp" ctest --output-on-failure -j $(JOBS) -E "^(Pjrt|Xla|GrpcCluster|GrpcInProcess|NetnsCluster|ClientSessionMail)"

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-python
