# `make install` and `make uninstall`, included by the top Makefile (which
# owns B, PREFIX and the build targets).
#
#   make install   [PREFIX=/usr/local] [DESTDIR=] [B=build]
#   make uninstall (the same variables as the install it undoes)
#
# Installs the binaries (ckpt, ckptfs, and ckpt-cuda when it was built),
# libckpt (static, shared with its soname links, the public headers ckpt.h
# ckpt_mount.h and ckpt_names.h, pkg-config file),
# the man pages, the mount(8) helper, the systemd unit template, an
# example configuration and the Python package ckptfs (python/ckptfs, pure
# Python: into PYTHONDIR, by default $(PREFIX)/lib/python3/dist-packages,
# which is where Debian's python3 looks when PREFIX=/usr). ckpt-gen is a development tool and is not
# installed. `uninstall` removes exactly those files; the example
# configuration only while it is unmodified, and nothing else under /etc.
#
# mount(8) runs helpers from /sbin whatever the prefix, so the helper goes to
# MOUNT_HELPER_DIR=/sbin (set it to another directory, or to nothing to skip
# it, when installing without root). ldconfig runs only when DESTDIR is empty.
# Every directory below can be set on the command line (LIBDIR=/usr/lib/x86_64-linux-gnu).

BINDIR           ?= $(PREFIX)/bin
LIBDIR           ?= $(PREFIX)/lib
INCLUDEDIR       ?= $(PREFIX)/include
PKGCONFIGDIR     ?= $(LIBDIR)/pkgconfig
MANDIR           ?= $(PREFIX)/share/man
SYSTEMDUNITDIR   ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR       ?= /etc
PYTHONDIR        ?= $(PREFIX)/lib/python3/dist-packages
MOUNT_HELPER_DIR ?= /sbin
INSTALL          ?= install
LDCONFIG         ?= ldconfig

PKG_DIR     := packaging
LIB_VERSION := $(shell sed -n 's/.*define CKPT_VERSION_STRING "\(.*\)"/\1/p' core/include/ckpt.h)
LIB_SONAME  := libckpt.so.0
LIB_REAL    := libckpt.so.$(LIB_VERSION)
MAN_PAGES   := man1/ckpt.1 man5/tpack.5 man8/ckptfs.8
# Other names under which ckptfs(8) is found (links to it).
MAN8_LINKS  := mount.ckptfs.8 mount.fuse.ckptfs.8
# Generated from templates into $(B)/packaging, then installed.
GEN_DIR     := $(B)/packaging
GEN_FILES   := $(GEN_DIR)/libckpt.pc $(GEN_DIR)/mount.ckptfs $(GEN_DIR)/ckptfs@.service

# Paths as installed, for the templates (no DESTDIR: they are read at run time).
SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@BINDIR@|$(BINDIR)|g' \
            -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
            -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
            -e 's|@VERSION@|$(LIB_VERSION)|g'

D_BIN  = $(DESTDIR)$(BINDIR)
D_LIB  = $(DESTDIR)$(LIBDIR)
D_MAN  = $(DESTDIR)$(MANDIR)
D_ETC  = $(DESTDIR)$(SYSCONFDIR)/ckptfs
D_PY   = $(DESTDIR)$(PYTHONDIR)/ckptfs
PY_FILES := $(notdir $(wildcard python/ckptfs/*.py))

# Refreshes the linker cache after a real (DESTDIR-less) install as root.
define RUN_LDCONFIG
if [ -n "$(DESTDIR)" ]; then :; \
elif [ "$$(id -u)" -eq 0 ] && command -v $(LDCONFIG) >/dev/null; then $(LDCONFIG); \
else echo "not root: run ldconfig as root to refresh the linker cache"; fi
endef

.PHONY: install uninstall FORCE

# The generated files depend on the install paths, which can change between
# runs without any file changing: always regenerate them (it is cheap).
$(GEN_DIR)/libckpt.pc: $(PKG_DIR)/libckpt.pc.in FORCE
$(GEN_DIR)/mount.ckptfs: $(PKG_DIR)/mount.ckptfs.in FORCE
$(GEN_DIR)/ckptfs@.service: $(PKG_DIR)/systemd/ckptfs@.service FORCE
$(GEN_FILES):
	@mkdir -p $(dir $@)
	$(SUBST) $< >$@.tmp && mv $@.tmp $@
FORCE:

# `all` first: it builds ckpt-cuda where it can, and the recipe installs it
# when it exists by then.
install: all $(GEN_FILES)
	$(INSTALL) -d $(D_BIN) $(D_LIB) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	    $(D_MAN)/man1 $(D_MAN)/man5 $(D_MAN)/man8 $(DESTDIR)$(SYSTEMDUNITDIR) $(D_ETC)
	$(INSTALL) -m 0755 $(B)/bin/ckpt $(B)/bin/ckptfs $(D_BIN)/
	if [ -x $(B)/bin/ckpt-cuda ]; then \
	    $(INSTALL) -m 0755 $(B)/bin/ckpt-cuda $(D_BIN)/ && \
	    gzip -9n <$(PKG_DIR)/man/ckpt-cuda.1 >$(D_MAN)/man1/ckpt-cuda.1.gz && \
	    chmod 0644 $(D_MAN)/man1/ckpt-cuda.1.gz; \
	fi
	$(INSTALL) -m 0644 $(B)/lib/libckpt.a $(D_LIB)/libckpt.a
	$(INSTALL) -m 0755 $(B)/lib/libckpt.so $(D_LIB)/$(LIB_REAL)
	ln -sf $(LIB_REAL) $(D_LIB)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(D_LIB)/libckpt.so
	@# ckpt_internal.h stays out: it is the tree's own unstable API.
	$(INSTALL) -m 0644 core/include/ckpt.h core/include/ckpt_mount.h core/include/ckpt_names.h $(DESTDIR)$(INCLUDEDIR)/
	$(INSTALL) -m 0644 $(GEN_DIR)/libckpt.pc $(DESTDIR)$(PKGCONFIGDIR)/libckpt.pc
	for m in $(MAN_PAGES); do \
	    gzip -9n <$(PKG_DIR)/man/$${m#*/} >$(D_MAN)/$$m.gz && chmod 0644 $(D_MAN)/$$m.gz || exit 1; \
	done
	for l in $(MAN8_LINKS); do ln -sf ckptfs.8.gz $(D_MAN)/man8/$$l.gz || exit 1; done
	$(INSTALL) -m 0644 $(GEN_DIR)/ckptfs@.service $(DESTDIR)$(SYSTEMDUNITDIR)/ckptfs@.service
	if [ -n "$(MOUNT_HELPER_DIR)" ]; then \
	    $(INSTALL) -d $(DESTDIR)$(MOUNT_HELPER_DIR) && \
	    $(INSTALL) -m 0755 $(GEN_DIR)/mount.ckptfs $(DESTDIR)$(MOUNT_HELPER_DIR)/mount.ckptfs && \
	    ln -sf mount.ckptfs $(DESTDIR)$(MOUNT_HELPER_DIR)/mount.fuse.ckptfs; \
	fi
	@# An existing configuration is the administrator's: never overwrite it.
	if [ -e $(D_ETC)/example.conf ]; then \
	    echo "keeping the existing $(D_ETC)/example.conf"; \
	else \
	    $(INSTALL) -m 0644 $(PKG_DIR)/systemd/example.conf $(D_ETC)/example.conf; \
	fi
	$(INSTALL) -d $(D_PY)
	$(INSTALL) -m 0644 $(addprefix python/ckptfs/,$(PY_FILES)) $(D_PY)/
	@# Say so when the python3 on this machine would not find it there.
	if [ -z "$(DESTDIR)" ] && command -v python3 >/dev/null && \
	    ! python3 -c 'import sys; sys.exit("$(PYTHONDIR)" not in sys.path)' 2>/dev/null; then \
	    echo "note: python3 does not look in $(PYTHONDIR): add it to PYTHONPATH, install with PYTHONDIR=<a directory python3 searches>, or pip install ./python"; \
	fi
	$(RUN_LDCONFIG)

uninstall:
	rm -f $(D_BIN)/ckpt $(D_BIN)/ckptfs $(D_BIN)/ckpt-cuda
	rm -f $(D_LIB)/libckpt.a $(D_LIB)/$(LIB_REAL) $(D_LIB)/$(LIB_SONAME) $(D_LIB)/libckpt.so
	rm -f $(DESTDIR)$(INCLUDEDIR)/ckpt.h $(DESTDIR)$(INCLUDEDIR)/ckpt_mount.h $(DESTDIR)$(INCLUDEDIR)/ckpt_names.h $(DESTDIR)$(PKGCONFIGDIR)/libckpt.pc
	rm -f $(addprefix $(D_MAN)/,$(addsuffix .gz,$(MAN_PAGES))) $(D_MAN)/man1/ckpt-cuda.1.gz \
	    $(addprefix $(D_MAN)/man8/,$(addsuffix .gz,$(MAN8_LINKS)))
	rm -f $(DESTDIR)$(SYSTEMDUNITDIR)/ckptfs@.service
	if [ -n "$(MOUNT_HELPER_DIR)" ]; then \
	    rm -f $(DESTDIR)$(MOUNT_HELPER_DIR)/mount.ckptfs $(DESTDIR)$(MOUNT_HELPER_DIR)/mount.fuse.ckptfs; \
	fi
	@# The example goes only if it is still the one we installed.
	if [ -f $(D_ETC)/example.conf ] && cmp -s $(PKG_DIR)/systemd/example.conf $(D_ETC)/example.conf; then \
	    rm -f $(D_ETC)/example.conf; \
	elif [ -e $(D_ETC)/example.conf ]; then \
	    echo "keeping $(D_ETC)/example.conf: it was changed"; \
	fi
	rmdir $(D_ETC) 2>/dev/null || true
	rm -f $(addprefix $(D_PY)/,$(PY_FILES))
	@# Byte code python3 wrote next to them when it imported the package.
	rm -f $(addprefix $(D_PY)/__pycache__/,$(PY_FILES:.py=.*.pyc))
	rmdir $(D_PY)/__pycache__ 2>/dev/null || true
	rmdir $(D_PY) 2>/dev/null || true
	$(RUN_LDCONFIG)
