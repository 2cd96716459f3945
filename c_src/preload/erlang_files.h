/*
 * Source file names of Erlang frames (erlang_files.c): read from the VM's
 * own list of character codes, and kept here for good, since the VM's copy
 * goes with the code when it is purged.
 */
#ifndef MT_ERLANG_FILES_H
#define MT_ERLANG_FILES_H

#include <stddef.h>
#include <stdint.h>

/* The text (UTF-8) of a file name the VM keeps as a list of character
 * codes, written to out with its NUL; its length, 0 if t is anything else.
 * A name longer than out keeps its end, from a directory on if it can,
 * after "...": the file's own name is what tells it apart. */
size_t mt_erl_list_text(uint64_t t, char *out, size_t len);

/* The kept copy of text (len bytes); NULL only when no memory could be
 * mapped for it.  The store grows as names come: none is turned away. */
const char *mt_erl_keep_file(const char *text, size_t len);

#endif
