# mk/install.mk — installing libmxkv for C and C++ users (included from the Makefile).
#
#   make install   [PREFIX=/usr/local] [DESTDIR=]   lib/libmxkv.so.0 (+ libmxkv.so link, libmxkv.a),
#                  [STRIP=strip]                    both without debug information (symbols kept,
#                                                   as the wheel's library: cargo's release build
#                                                   carries line tables, 53 MB + 141 MB),
#                  include/mxkv/c_api.h, include/mxnet/c_api.h, lib/pkgconfig/libmxkv.pc
#   make uninstall [PREFIX=...]                      removes exactly those files
#                  (PREFIX absolute; as root without DESTDIR both run ldconfig)
#   make install-check   installs into a temporary prefix, builds ctests/install/mxnet_program.c
#                        with `pkg-config --cflags --libs libmxkv` only (gcc C11 and g++ C++17,
#                        -Wall -Werror), runs both, links it statically too, uninstalls, and
#                        checks that nothing is left behind; then links the same program straight
#                        against target/release (the soname link cargo's build stages there)

PREFIX     ?= /usr/local
DESTDIR    ?=
STRIP      ?= strip
LIBDIR_I   := $(PREFIX)/lib
INCDIR_I   := $(PREFIX)/include
PCDIR_I    := $(LIBDIR_I)/pkgconfig
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# `cargo rustc -- --print native-static-libs` lists these for libmxkv.a (libstdc++ for libzmq).
PRIVATE_LIBS := -lstdc++ -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
INSTALLED  := $(LIBDIR_I)/libmxkv.so.0 $(LIBDIR_I)/libmxkv.so $(LIBDIR_I)/libmxkv.a \
              $(INCDIR_I)/mxkv/c_api.h $(INCDIR_I)/mxnet/c_api.h $(PCDIR_I)/libmxkv.pc

.PHONY: install uninstall install-check

# PREFIX goes into the pkg-config file and the rpath it gives programs: a relative one
# would point somewhere else from every other folder, so it is refused before anything
# is written.
define check_prefix
	@case "$(PREFIX)" in /*) ;; *) echo "make: PREFIX must be an absolute path (got '$(PREFIX)')"; exit 1;; esac
endef
# The dynamic linker's cache lists system libraries by path: as root, without DESTDIR,
# install and uninstall both refresh it (an uninstall that did not left libmxkv.so.0 in
# `ldconfig -p` after the file was gone).
define refresh_ldconfig
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi
endef

install: build
	$(check_prefix)
	install -d $(DESTDIR)$(LIBDIR_I) $(DESTDIR)$(INCDIR_I)/mxkv $(DESTDIR)$(INCDIR_I)/mxnet $(DESTDIR)$(PCDIR_I)
	install -m 755 $(SO) $(DESTDIR)$(LIBDIR_I)/libmxkv.so.0
	ln -sf libmxkv.so.0 $(DESTDIR)$(LIBDIR_I)/libmxkv.so
	install -m 644 target/release/libmxkv.a $(DESTDIR)$(LIBDIR_I)/libmxkv.a
	$(STRIP) --strip-debug $(DESTDIR)$(LIBDIR_I)/libmxkv.so.0 $(DESTDIR)$(LIBDIR_I)/libmxkv.a
	install -m 644 include/mxkv/c_api.h $(DESTDIR)$(INCDIR_I)/mxkv/c_api.h
	install -m 644 include/mxnet/c_api.h $(DESTDIR)$(INCDIR_I)/mxnet/c_api.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR_I)|' -e 's|@INCLUDEDIR@|$(INCDIR_I)|' \
	    -e 's|@VERSION@|$(VERSION)|' -e 's|@PRIVATE_LIBS@|$(PRIVATE_LIBS)|' mk/libmxkv.pc.in \
	    > $(DESTDIR)$(PCDIR_I)/libmxkv.pc
	$(refresh_ldconfig)

uninstall:
	$(check_prefix)
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(INCDIR_I)/mxkv $(DESTDIR)$(INCDIR_I)/mxnet $(DESTDIR)$(PCDIR_I) 2>/dev/null
	$(refresh_ldconfig)

install-check: build
	bash ctests/install/check.sh
