# Builds vrange with cargo and installs it the way C libraries are installed:
#
#     make install PREFIX=/usr/local     # builds if needed; DESTDIR=/staging for packages
#     make uninstall PREFIX=/usr/local
#
# Installs the vrange command; libvrange.so (SONAME libvrange.so.MAJOR), libvrange.a (without
# debug information) and the preload shim libvrange_malloc.so; vrange.h; vrange.pc, pointing
# into PREFIX; vrange(1), a page per subcommand and vrange(3); the systemd unit of `vrange
# daemon`, naming BINDIR's command. `vrange run` finds the shim in
# ../lib from its own directory, so keep LIBDIR at $(PREFIX)/lib or pass it --lib.

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
MANDIR ?= $(PREFIX)/share/man
# systemd looks for units in /usr/local/lib/systemd/system too; a package puts them in
# /lib/systemd/system (SYSTEMDUNITDIR=/lib/systemd/system).
SYSTEMDUNITDIR ?= $(LIBDIR)/systemd/system

CARGO ?= cargo
STRIP ?= strip
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
BUILT := $(TARGET_DIR)/release

# The workspace version (the first `version =` of Cargo.toml, in [workspace.package]).
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n 1)
MAJOR := $(firstword $(subst ., ,$(VERSION)))
# Every function vrange(3) names gets a page that sources it, so that `man vrange_alloc` works.
MAN3_ALIASES := $(filter-out vrange,$(shell sed -n '/^\.SH NAME/{n;s/ \\-.*//;s/,//g;p;q}' docs/man/vrange.3))

.PHONY: all build install uninstall

all: build

build:
	$(CARGO) build --release --target-dir '$(TARGET_DIR)' -p vrange-ffi -p vrange-malloc-preload -p vrange-cli

install: build
	install -d '$(DESTDIR)$(BINDIR)' '$(DESTDIR)$(LIBDIR)' '$(DESTDIR)$(INCLUDEDIR)' \
		'$(DESTDIR)$(PKGCONFIGDIR)' '$(DESTDIR)$(MANDIR)/man1' '$(DESTDIR)$(MANDIR)/man3' \
		'$(DESTDIR)$(SYSTEMDUNITDIR)'
	install -m 755 '$(BUILT)/vrange' '$(DESTDIR)$(BINDIR)/vrange'
	install -m 755 '$(BUILT)/libvrange.so' '$(DESTDIR)$(LIBDIR)/libvrange.so.$(VERSION)'
	ln -sf 'libvrange.so.$(VERSION)' '$(DESTDIR)$(LIBDIR)/libvrange.so.$(MAJOR)'
	ln -sf 'libvrange.so.$(MAJOR)' '$(DESTDIR)$(LIBDIR)/libvrange.so'
	install -m 644 '$(BUILT)/libvrange.a' '$(DESTDIR)$(LIBDIR)/libvrange.a'
	$(STRIP) --strip-debug '$(DESTDIR)$(LIBDIR)/libvrange.a'
	install -m 755 '$(BUILT)/libvrange_malloc.so' '$(DESTDIR)$(LIBDIR)/libvrange_malloc.so'
	install -m 644 include/vrange.h '$(DESTDIR)$(INCLUDEDIR)/vrange.h'
	sed -e '/^#/d' -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
		-e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@RPATH@||' \
		crates/vrange-ffi/vrange.pc.in > '$(DESTDIR)$(PKGCONFIGDIR)/vrange.pc'
	'$(BUILT)/vrange' man '$(DESTDIR)$(MANDIR)/man1' > /dev/null
	install -m 644 docs/man/vrange.3 '$(DESTDIR)$(MANDIR)/man3/vrange.3'
	for name in $(MAN3_ALIASES); do \
		echo '.so man3/vrange.3' > '$(DESTDIR)$(MANDIR)/man3/'"$$name.3"; \
	done
	@# The unit names the command by the default prefix's path, so that it works copied by hand
	@# after a default install; installed, it names this prefix's.
	sed -e 's|/usr/local/bin/vrange |$(BINDIR)/vrange |' docs/systemd/vrange-daemon.service \
		> '$(DESTDIR)$(SYSTEMDUNITDIR)/vrange-daemon.service'
	chmod 644 '$(DESTDIR)$(SYSTEMDUNITDIR)/vrange-daemon.service'
	@# A library new to a directory ld.so already searches is found once its cache is rebuilt.
	if [ -z '$(DESTDIR)' ] && [ "$$(id -u)" = 0 ] && command -v ldconfig > /dev/null; then \
		ldconfig; \
	fi

uninstall:
	rm -f '$(DESTDIR)$(BINDIR)/vrange' \
		'$(DESTDIR)$(LIBDIR)/libvrange.so.$(VERSION)' '$(DESTDIR)$(LIBDIR)/libvrange.so.$(MAJOR)' \
		'$(DESTDIR)$(LIBDIR)/libvrange.so' '$(DESTDIR)$(LIBDIR)/libvrange.a' \
		'$(DESTDIR)$(LIBDIR)/libvrange_malloc.so' '$(DESTDIR)$(INCLUDEDIR)/vrange.h' \
		'$(DESTDIR)$(PKGCONFIGDIR)/vrange.pc' \
		'$(DESTDIR)$(MANDIR)/man1/vrange.1' '$(DESTDIR)$(MANDIR)/man1/vrange-'*.1 \
		'$(DESTDIR)$(MANDIR)/man3/vrange.3' '$(DESTDIR)$(SYSTEMDUNITDIR)/vrange-daemon.service'
	for name in $(MAN3_ALIASES); do rm -f '$(DESTDIR)$(MANDIR)/man3/'"$$name.3"; done
