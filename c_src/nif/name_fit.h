/*
 * Long demangled C++ names made to fit a symbol's text: shortened where
 * they say least, so that the function's own name survives.
 */
#ifndef MT_NAME_FIT_H
#define MT_NAME_FIT_H

#include <stddef.h>

/* Shortens the name s in place to at most max bytes (not counting its
 * NUL): template argument lists collapsed to "<...>", the longest
 * innermost one first (as Mtrace.Frame.fit/2 does for a report's line),
 * then the last argument list to "(...)", and if that is still too long,
 * its start cut to "..." (the end names the function), at a character's
 * start.  A name that fits is left alone.  Returns its new length. */
size_t mt_name_fit(char *s, size_t max);

/* The length of s (NULL: 0) cut to at most max bytes, at a character's
 * start: a cut inside a UTF-8 sequence makes a binary that is not valid
 * text, which report/1 then refuses to print (a C function named with 300
 * accented letters). */
size_t mt_text_cut(const char *s, size_t max);

#endif
