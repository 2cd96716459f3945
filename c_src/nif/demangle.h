/*
 * C++ names demangled in-process, for the symbolizer.  mt_demangle(), the
 * buffer-filling form, is declared in symbols.h.
 */
#ifndef MT_DEMANGLE_H
#define MT_DEMANGLE_H

/* Finds the demangler (which may dlopen libstdc++): done by the first call
 * anyway, but callers about to take locks do it first. */
void mt_demangle_prepare(void);

/* The demangled name (malloc'd: free it), shortened to fit MT_SYM_TEXT
 * (name_fit.h), or NULL when name is not a mangled C++ name or no
 * demangler is available. */
char *mt_demangle_dup(const char *name);

#endif
