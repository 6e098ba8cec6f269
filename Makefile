# Contracts: `make build` -> build/ (CLI at build/bin/pw); `make test` runs every test; `make demo` runs the main job.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: deps build python test demo asan tsan clean

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The Python package (nanobind extension built by scikit-build-core into build-python/), editable.
python: deps
	.venv/bin/pip install -q --no-build-isolation -e .

test: build python
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)
	.venv/bin/python -m pytest -q python/tests

demo: build
	$(BUILD_DIR)/bin/pw example figure2
	$(BUILD_DIR)/bin/pw bench dispatch --islands 2 --hosts 4 --devices-per-host 2

# Sanitizer builds: ASan+UBSan and TSan, each in its own build directory.
asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPW_SANITIZE=address
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS)

tsan: deps
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPW_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS)
	# The prebuilt PJRT plugin is not TSan-instrumented (its locks are invisible to TSan), so the
	# PJRT tests run in the other builds only.
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/scripts/tsan.supp" ctest --output-on-failure -j $(JOBS) -E "^(Pjrt|XlaFunctions)"

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-python
