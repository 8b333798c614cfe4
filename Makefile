# ckptfs build. `make` builds everything, `make demo` runs the demo,
# `make check` runs all tests (unit tests also under ASan+UBSan).
CC      ?= cc
CLANG   ?= clang
PREFIX  ?= /usr/local
OPT     ?= -O2 -g
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN    += -Werror
endif
CSTD    := -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64
# Code outside core sees core's public headers only (ckpt.h, ckpt_mount.h,
# and ckpt_internal.h when a file asks for it by defining CKPT_INTERNAL_API).
CFLAGS_API = $(CSTD) $(OPT) $(WARN) -pthread -fPIC -Icore/include $(SHA_CFLAGS) $(CPPFLAGS) $(CFLAGS)
# libxml2's headers live in their own directory; only core's S3 code needs them.
XML_CFLAGS := $(shell pkg-config --cflags libxml-2.0 2>/dev/null || echo -I/usr/include/libxml2)
CFLAGS_ALL = $(CFLAGS_API) -Icore/src $(XML_CFLAGS)
# Header dependencies: each compile writes a .d file beside its output
# (a binary built straight from its source: <binary>.d).
DEPFLAGS := -MMD -MP
DEPFLAGS_BIN = $(DEPFLAGS) -MF $@.d -MT $@
# libcurl: HTTP and SigV4 signing for S3 stores; libxml2: S3's XML answers.
CORE_LIBS  := -lsodium -lzstd -ldeflate -lz -ljansson -lcurl -lxml2 -lm -pthread
# Content checksums (SHA-256 of every file and tensor) through OpenSSL's
# libcrypto, which uses the CPU's SHA instructions; libsodium has only a
# portable SHA-256, 5-7x slower, and hashing was 80% of packing time.
# SHA256=sodium builds without libcrypto (same digests, slower packing).
SHA256  ?= openssl
ifeq ($(SHA256),openssl)
SHA_CFLAGS := -DCKPT_USE_OPENSSL
CORE_LIBS += -lcrypto
endif
FUSE_CFLAGS = $(shell pkg-config --cflags fuse3 2>/dev/null)
FUSE_LIBS   = $(shell pkg-config --libs fuse3 2>/dev/null)
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

B := build
CORE_SRC := $(wildcard core/src/*.c core/src/*/*.c)
CORE_OBJ := $(CORE_SRC:%.c=$(B)/%.o)
CORE_ASAN_OBJ := $(CORE_SRC:%.c=$(B)/asan/%.o)
CKPT_SRC := $(wildcard tools/ckpt/*.c)
GEN_SRC  := $(wildcard tools/gen/*.c)
# The daemon's layers (fs/README.md) form an internal static library that
# fs/main.c and the unit tests link against.
FS_LIB_SRC := $(wildcard fs/common/*.c fs/read/*.c fs/write/*.c fs/fuse/*.c)
FS_SRC   := $(wildcard fs/main.c) $(FS_LIB_SRC)
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(B)/tests/%)
UNIT_ASAN_BIN := $(UNIT_SRC:tests/unit/%.c=$(B)/asan/tests/%)
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:fuzz/%.c=$(B)/fuzz/%)

BINS := $(B)/bin/ckpt $(B)/bin/ckpt-gen
ifneq ($(FS_SRC),)
BINS += $(B)/bin/ckptfs
endif

.PHONY: all deps demo check lint-layout format format-check venv unit unit-asan integration fuzz bench bench-quick bench-pack bench-mount bench-write bench-aead bench-codec bench-formats bench-s3 clean
all: $(B)/lib/libckpt.a $(B)/lib/libckpt.so $(BINS) cuda

# The optional CUDA tool lives in its own makefile: it defines the targets
# `cuda` (build, or one line saying why not) and `cuda-check` (its tests).
CUDA_MK := $(wildcard tools/cuda/cuda.mk)
ifneq ($(CUDA_MK),)
include $(CUDA_MK)
else
.PHONY: cuda cuda-check
cuda:
cuda-check:
endif

deps:
	@scripts/deps.sh build

$(B)/core/%.o: core/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(DEPFLAGS) -c $< -o $@

$(B)/tools/%.o: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_API) $(DEPFLAGS) -c $< -o $@

# The daemon sees core through its public headers only, like the tools.
$(B)/fs/%.o: fs/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_API) -Ifs $(FUSE_CFLAGS) $(DEPFLAGS) -c $< -o $@

$(B)/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(SAN) $(if $(filter fs/%,$<),-Ifs $(FUSE_CFLAGS)) $(DEPFLAGS) -c $< -o $@

$(B)/lib/libckpt.a: $(CORE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/lib/libckpt.so: $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(LDFLAGS) -shared -Wl,-soname,libckpt.so.0 -o $@ $^ $(CORE_LIBS)

$(B)/lib/libckpt-asan.a: $(CORE_ASAN_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/bin/ckpt: $(CKPT_SRC:%.c=$(B)/%.o) $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(LDFLAGS) -o $@ $^ $(CORE_LIBS)

$(B)/bin/ckpt-gen: $(GEN_SRC:%.c=$(B)/%.o) $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(LDFLAGS) -o $@ $^ $(CORE_LIBS) -lm

$(B)/lib/libckptfs.a: $(FS_LIB_SRC:%.c=$(B)/%.o)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/lib/libckptfs-asan.a: $(FS_LIB_SRC:%.c=$(B)/asan/%.o)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/bin/ckptfs: $(B)/fs/main.o $(B)/lib/libckptfs.a $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(LDFLAGS) -o $@ $^ $(FUSE_LIBS) $(CORE_LIBS)

# Unit tests link the daemon's layers too: tests of fs/write and fs/common
# use them without FUSE.
UNIT_CFLAGS = -Itests/unit -Ifs $(FUSE_CFLAGS)
UNIT_LIBS   = -lcriterion $(FUSE_LIBS) $(CORE_LIBS) -lm

$(B)/tests/%: tests/unit/%.c $(B)/lib/libckptfs.a $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(UNIT_CFLAGS) $(DEPFLAGS_BIN) -o $@ $< $(B)/lib/libckptfs.a $(B)/lib/libckpt.a $(UNIT_LIBS)

$(B)/asan/tests/%: tests/unit/%.c $(B)/lib/libckptfs-asan.a $(B)/lib/libckpt-asan.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(SAN) $(UNIT_CFLAGS) $(DEPFLAGS_BIN) -o $@ $< $(B)/lib/libckptfs-asan.a $(B)/lib/libckpt-asan.a $(UNIT_LIBS)

# What -MMD wrote (absent before the first build; -MP keeps a deleted header
# from breaking the next one).
-include $(CORE_OBJ:.o=.d) $(CORE_ASAN_OBJ:.o=.d) $(CKPT_SRC:%.c=$(B)/%.d) $(GEN_SRC:%.c=$(B)/%.d) \
    $(FS_SRC:%.c=$(B)/%.d) $(FS_LIB_SRC:%.c=$(B)/asan/%.d) $(UNIT_BIN:=.d) $(UNIT_ASAN_BIN:=.d) \
    $(patsubst bench/%.c,$(B)/bench/%.d,$(wildcard bench/*.c))

$(B)/fuzz/%: fuzz/%.c $(CORE_SRC)
	@mkdir -p $(dir $@)
	$(CLANG) $(CSTD) $(WARN) -O1 -g -Icore/include -Icore/src $(XML_CFLAGS) -fsanitize=fuzzer,address,undefined -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION -o $@ $< $(CORE_SRC) $(CORE_LIBS) -lm

demo:
	@scripts/deps.sh build
	@$(MAKE) --no-print-directory all
	@scripts/demo.sh

# Tests that check parsers against files written by the real clients (torch,
# gguf, tensorizer) run them from the venv of pinned versions; without one
# (a plain `make unit`) they skip, and `make check` always makes it.
VENV_PY = $(abspath $(B))/venv/bin/python
export CKPT_PYTHON ?= $(VENV_PY)

venv:
	@B=$(B) scripts/venv.sh >/dev/null

unit: $(UNIT_BIN)
	@scripts/run-unit.sh $(UNIT_BIN)

unit-asan: $(UNIT_ASAN_BIN)
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  scripts/run-unit.sh $(UNIT_ASAN_BIN)

# test_s3.sh loads an s3:// pack through ckpt-cuda's fake device
# (test_cuda_load), so the host tests are built first.
integration: all $(CKCU_TEST_BIN)
	@B=$(B) tests/integration/run.sh

# The include layout of fs/README.md: one-way dependencies, no cycles.
lint-layout:
	@scripts/lint-layout.py

# One format for every C file (.clang-format); `make format` applies it.
FORMAT_SRC = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
format:
	@clang-format -i --style=file $(FORMAT_SRC)

format-check:
	@clang-format --dry-run --Werror --style=file $(FORMAT_SRC) && \
	  echo "format-check: $(words $(FORMAT_SRC)) files formatted"

check:
	@scripts/deps.sh test
	@$(MAKE) --no-print-directory lint-layout
	@$(MAKE) --no-print-directory format-check
	@$(MAKE) --no-print-directory venv
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory unit-asan
	@$(MAKE) --no-print-directory integration
	@$(MAKE) --no-print-directory cuda-check
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$${FUZZ_SECONDS:-20}

FUZZ_SECONDS ?= 60
fuzz: $(FUZZ_BIN)
	@scripts/run-fuzz.sh $(FUZZ_SECONDS) $(FUZZ_BIN)

# Benchmarks need root for dropping caches. `make bench` writes bench/report.md
# and .png (about 30 minutes on 2 cores); BENCH_ARGS=--quick (or `make
# bench-quick`) is a smoke run of a few minutes into bench/out/report-quick.*.
# The three below print their own tables (--quick: a smaller checkpoint).
bench: all
	@scripts/deps.sh bench
	@B=$(B) bench/report.sh $(BENCH_ARGS)

bench-quick: all
	@scripts/deps.sh bench
	@B=$(B) bench/report.sh --quick $(BENCH_ARGS)

bench-pack: all
	@scripts/deps.sh bench
	@B=$(B) bench/bench-pack.sh $(BENCH_ARGS)

bench-mount: all
	@scripts/deps.sh bench
	@B=$(B) bench/bench-mount.sh $(BENCH_ARGS)

bench-write: all
	@scripts/deps.sh bench
	@B=$(B) bench/bench-write.sh $(BENCH_ARGS)

# Single-core codec speed (bench/bench-codec.sh): plane coders compared, and
# the library's chunk encode/decode with CRC or AEAD on real chunks.
BENCH_C_BIN := $(patsubst bench/%.c,$(B)/bench/%,$(wildcard bench/*.c))
$(B)/bench/%: bench/%.c $(B)/lib/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(DEPFLAGS_BIN) -o $@ $< $(B)/lib/libckpt.a $(CORE_LIBS)

bench-codec: $(BENCH_C_BIN) $(B)/bin/ckpt $(B)/bin/ckpt-gen
	@B=$(B) bench/bench-codec.sh $(BENCH_ARGS)

bench-aead: $(B)/bench/aead_speed
	@$(B)/bench/aead_speed $(BENCH_ARGS)
	@$(B)/bench/aead_speed --size 65536 $(BENCH_ARGS)

# The same tensors as safetensors, torch.save, DCP, tensorizer, GGUF and a raw
# blob: ratios and packing speed against the issue-13 targets, beside gzip,
# zstd and ZipNN (also a section of `make bench`).
bench-formats: all
	@scripts/deps.sh bench
	@B=$(B) bench/bench-formats.sh $(BENCH_ARGS)

# Packs on S3 against a Ceph RGW started for the run (needs root).
bench-s3: all
	@scripts/deps.sh bench
	@B=$(B) bench/bench-s3.sh $(BENCH_ARGS)

# install, uninstall, man pages and the Debian package live in packaging/.
-include packaging/install.mk

clean:
	rm -rf $(B)
