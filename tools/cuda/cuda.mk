# ckpt-cuda and libckpt_cuda, included by the top Makefile (which owns B, CC,
# CFLAGS_API, DEPFLAGS, CORE_LIBS, SAN and the libckpt targets).
#
#   make cuda        $(B)/lib/libckpt_cuda.a and $(B)/bin/ckpt-cuda, or one
#                    line saying why not (no nvcc, so no CUDA toolkit)
#   make cuda-check  the host-side tests (planner, ring, load and save over a
#                    fake device; they need no CUDA, so they always run, also
#                    under ASan+UBSan), then the GPU tests, which skip cleanly
#                    on a machine without a device
#
# The toolkit is found by nvcc: $(CUDA_HOME)/bin/nvcc when CUDA_HOME is set
# (and only there, so CUDA_HOME=/nonexistent hides it), else
# /usr/local/cuda/bin/nvcc, else nvcc on PATH. No .cu file is needed: the
# runtime API is called from C, compiled by $(CC) against the toolkit's
# headers and linked with its static cudart.

.PHONY: cuda cuda-check

ifneq ($(strip $(CUDA_HOME)),)
CKCU_NVCC := $(wildcard $(CUDA_HOME)/bin/nvcc)
else
CKCU_NVCC := $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
endif
CKCU_ROOT := $(patsubst %/bin/nvcc,%,$(CKCU_NVCC))
CKCU_INC := $(patsubst %/cuda_runtime_api.h,%,$(firstword $(wildcard \
    $(CKCU_ROOT)/include/cuda_runtime_api.h $(CKCU_ROOT)/targets/*/include/cuda_runtime_api.h)))
CKCU_STATIC := $(firstword $(wildcard $(CKCU_ROOT)/lib64/libcudart_static.a \
    $(CKCU_ROOT)/targets/*/lib/libcudart_static.a $(CKCU_ROOT)/lib/libcudart_static.a))
CKCU_SHARED := $(firstword $(wildcard $(CKCU_ROOT)/lib64/libcudart.so \
    $(CKCU_ROOT)/targets/*/lib/libcudart.so $(CKCU_ROOT)/lib/libcudart.so))
# Static cudart, as nvcc links by default: the tool then runs wherever a
# driver is installed, without the toolkit on the library path.
ifneq ($(CKCU_STATIC),)
CKCU_CUDART := $(CKCU_STATIC) -ldl -lrt -pthread
else ifneq ($(CKCU_SHARED),)
CKCU_CUDART := -L$(dir $(CKCU_SHARED)) -Wl,-rpath,$(dir $(CKCU_SHARED)) -lcudart
endif

CKCU_SKIP := ckpt-cuda: nvcc not found (set CUDA_HOME); skipping the CUDA tool
ifneq ($(CKCU_NVCC),)
ifeq ($(CKCU_INC),)
CKCU_SKIP := ckpt-cuda: $(CKCU_ROOT) has no cuda_runtime_api.h; skipping the CUDA tool
else ifeq ($(CKCU_CUDART),)
CKCU_SKIP := ckpt-cuda: $(CKCU_ROOT) has no libcudart; skipping the CUDA tool
else
CKCU_SKIP :=
endif
endif

CKCU_DIR := tools/cuda
# Plain C, no CUDA headers: the pipelines, planner, ring, sources, tool logic.
CKCU_HOST_SRC := util.c plan.c ring.c source.c src_pack.c src_mount.c load.c verify.c \
    sthdr.c save.c bench.c
# The only sources that need the toolkit (api.c binds the pipelines to it).
CKCU_CUDA_SRC := backend_cuda.c api.c
CKCU_TOOL_SRC := main.c cmd_load.c tool.c
CKCU_HOST_TESTS := test_cuda_plan test_cuda_ring test_cuda_load test_cuda_save

# Core's public headers only, like every tool; headers are tracked by -MMD.
CKCU_CFLAGS = $(CFLAGS_API) -I$(CKCU_DIR)
CKCU_TEST_CFLAGS = $(CKCU_CFLAGS) -I$(CKCU_DIR)/tests -Itests/unit

CKCU_HOST_OBJ := $(CKCU_HOST_SRC:%.c=$(B)/$(CKCU_DIR)/%.o)
CKCU_HOST_ASAN_OBJ := $(CKCU_HOST_SRC:%.c=$(B)/asan/$(CKCU_DIR)/%.o)
CKCU_CUDA_OBJ := $(CKCU_CUDA_SRC:%.c=$(B)/$(CKCU_DIR)/%.o)
CKCU_TOOL_OBJ := $(CKCU_TOOL_SRC:%.c=$(B)/$(CKCU_DIR)/%.o)
CKCU_FAKE_OBJ := $(B)/$(CKCU_DIR)/tests/fake_backend.o
CKCU_FAKE_ASAN_OBJ := $(B)/asan/$(CKCU_DIR)/tests/fake_backend.o
CKCU_TEST_BIN := $(CKCU_HOST_TESTS:%=$(B)/tests/cuda/%)
CKCU_TEST_ASAN_BIN := $(CKCU_HOST_TESTS:%=$(B)/asan/tests/cuda/%)
CKCU_GPU_TEST := $(B)/tests/cuda/test_cuda_gpu

$(CKCU_HOST_OBJ) $(CKCU_TOOL_OBJ) $(CKCU_FAKE_OBJ): $(B)/$(CKCU_DIR)/%.o: $(CKCU_DIR)/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CKCU_CFLAGS) $(DEPFLAGS) -c $< -o $@

$(CKCU_HOST_ASAN_OBJ) $(CKCU_FAKE_ASAN_OBJ): $(B)/asan/$(CKCU_DIR)/%.o: $(CKCU_DIR)/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CKCU_CFLAGS) $(SAN) $(DEPFLAGS) -c $< -o $@

# -isystem: the toolkit's headers are not ours to keep warning-free.
$(CKCU_CUDA_OBJ): $(B)/$(CKCU_DIR)/%.o: $(CKCU_DIR)/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CKCU_CFLAGS) -isystem $(CKCU_INC) $(DEPFLAGS) -c $< -o $@

$(CKCU_TEST_BIN): $(B)/tests/cuda/%: $(CKCU_DIR)/tests/%.c $(CKCU_FAKE_OBJ) $(CKCU_HOST_OBJ) \
    $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(CKCU_TEST_CFLAGS) $(DEPFLAGS_BIN) -o $@ $< $(CKCU_FAKE_OBJ) $(CKCU_HOST_OBJ) \
	    $(B)/lib/libckpt.a -lcriterion $(CORE_LIBS)

$(CKCU_TEST_ASAN_BIN): $(B)/asan/tests/cuda/%: $(CKCU_DIR)/tests/%.c $(CKCU_FAKE_ASAN_OBJ) \
    $(CKCU_HOST_ASAN_OBJ) $(B)/lib/libckpt-asan.a
	@mkdir -p $(dir $@)
	$(CC) $(CKCU_TEST_CFLAGS) $(SAN) $(DEPFLAGS_BIN) -o $@ $< $(CKCU_FAKE_ASAN_OBJ) \
	    $(CKCU_HOST_ASAN_OBJ) $(B)/lib/libckpt-asan.a -lcriterion $(CORE_LIBS)

# The load pipeline's host side over the fake device (bench/cuda/host_pipeline.c):
# make bench-cuda-host PACK=x.tpack [KEY=k] [THREADS="1 2"]; no CUDA needed.
CKCU_BENCH_BIN := $(B)/bench/cuda/host_pipeline
$(CKCU_BENCH_BIN): bench/cuda/host_pipeline.c $(CKCU_FAKE_OBJ) $(CKCU_HOST_OBJ) $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(CKCU_TEST_CFLAGS) $(DEPFLAGS_BIN) -o $@ $< $(CKCU_FAKE_OBJ) $(CKCU_HOST_OBJ) \
	    $(B)/lib/libckpt.a $(CORE_LIBS)

.PHONY: bench-cuda-host
bench-cuda-host: $(CKCU_BENCH_BIN)
	@$(CKCU_BENCH_BIN) "$${PACK:?PACK=x.tpack}" "$${KEY:--}" $${THREADS:-1 2}

-include $(CKCU_BENCH_BIN).d $(CKCU_HOST_OBJ:.o=.d) $(CKCU_HOST_ASAN_OBJ:.o=.d) $(CKCU_CUDA_OBJ:.o=.d) \
    $(CKCU_TOOL_OBJ:.o=.d) $(CKCU_FAKE_OBJ:.o=.d) $(CKCU_FAKE_ASAN_OBJ:.o=.d) \
    $(CKCU_TEST_BIN:=.d) $(CKCU_TEST_ASAN_BIN:=.d) $(CKCU_GPU_TEST).d

CKCU_HOST_CHECK = scripts/run-unit.sh $(CKCU_TEST_BIN) && \
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    scripts/run-unit.sh $(CKCU_TEST_ASAN_BIN)

ifeq ($(CKCU_SKIP),)

$(B)/lib/libckpt_cuda.a: $(CKCU_HOST_OBJ) $(CKCU_CUDA_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/bin/ckpt-cuda: $(CKCU_TOOL_OBJ) $(B)/lib/libckpt_cuda.a $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -o $@ $^ $(CKCU_CUDART) $(CORE_LIBS)

# Not under ASan: the CUDA driver maps memory where ASan's shadow lives.
$(CKCU_GPU_TEST): $(CKCU_DIR)/tests/test_cuda_gpu.c $(B)/lib/libckpt_cuda.a $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(CKCU_TEST_CFLAGS) $(DEPFLAGS_BIN) -o $@ $< $(B)/lib/libckpt_cuda.a $(B)/lib/libckpt.a -lcriterion \
	    $(CKCU_CUDART) $(CORE_LIBS)

cuda: $(B)/lib/libckpt_cuda.a $(B)/bin/ckpt-cuda

# The GPU tests skip one by one without a device; say so once, plainly.
cuda-check: $(CKCU_TEST_BIN) $(CKCU_TEST_ASAN_BIN) $(CKCU_GPU_TEST) $(B)/bin/ckpt-cuda
	@$(CKCU_HOST_CHECK)
	@msg=$$($(B)/bin/ckpt-cuda devices 2>&1 >/dev/null) || \
	  echo "cuda-check: GPU tests skip: $${msg#ckpt-cuda: }"
	@scripts/run-unit.sh $(CKCU_GPU_TEST)

else

cuda:
	@echo "$(CKCU_SKIP)"

cuda-check: $(CKCU_TEST_BIN) $(CKCU_TEST_ASAN_BIN)
	@$(CKCU_HOST_CHECK)
	@echo "$(CKCU_SKIP) and its GPU tests"

endif
