/*
 * Long demangled C++ names made to fit (see name_fit.h).  Cutting the end
 * of "ns::Table<std::map<...>, ...>::grow(...)" at 511 bytes left only the
 * class's template arguments, so two methods of one class read the same
 * and merged into one site of a flame graph or an export.
 */
#include "name_fit.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Is s[i] part of an operator's name ("operator<<", "operator->",
 * "operator<=>") rather than a bracket? */
static int operator_char(const char *s, size_t i) {
    if (s[i] == '>' && i > 0 && s[i - 1] == '-')
        return 1; /* "->", in an operator or an expression */
    size_t j = i;
    while (j > 0 && i - j < 3 && strchr("<>=-", s[j - 1]))
        j--;
    return j >= 8 && memcmp(s + j - 8, "operator", 8) == 0;
}

/* Replaces s[at, at + len) by the len2 bytes of with. */
static void splice(char *s, size_t at, size_t len, const char *with, size_t len2) {
    memmove(s + at + len2, s + at + len, strlen(s + at + len) + 1);
    memcpy(s + at, with, len2);
}

/* Collapses the longest innermost template argument list to "<...>": one
 * holding no list longer than "<...>" (so "<int>" does not hold its
 * enclosing list back); 0 when none is longer. */
static int collapse_template(char *s) {
    struct {
        size_t at;
        int innermost;
    } open[64];
    size_t depth = 0, deeper = 0, best_at = 0, best_len = 0;
    for (size_t i = 0; s[i]; i++) {
        if ((s[i] != '<' && s[i] != '>') || operator_char(s, i))
            continue;
        if (s[i] == '<') {
            if (depth < sizeof open / sizeof open[0])
                open[depth++].at = i, open[depth - 1].innermost = 1;
            else
                deeper++; /* past 64 levels: left as it is */
            continue;
        }
        if (deeper) {
            deeper--;
            continue;
        }
        if (depth == 0)
            continue; /* a ">" of no list */
        depth--;
        size_t len = i - open[depth].at + 1;
        int shortest = open[depth].innermost && len <= 5;
        if (open[depth].innermost && len > best_len)
            best_at = open[depth].at, best_len = len;
        if (depth > 0 && !shortest)
            open[depth - 1].innermost = 0;
    }
    if (best_len <= 5)
        return 0;
    splice(s, best_at, best_len, "<...>", 5);
    return 1;
}

/* Collapses the last argument list at the top level ("f(int, long) const")
 * to "(...)"; 0 when there is none longer. */
static int collapse_arguments(char *s) {
    size_t depth = 0, open = SIZE_MAX, at = 0, len = 0;
    for (size_t i = 0; s[i]; i++) {
        if ((s[i] == '<' || s[i] == '>') && operator_char(s, i))
            continue;
        if (s[i] == '(' || s[i] == '<') {
            if (depth++ == 0 && s[i] == '(')
                open = i;
        } else if ((s[i] == ')' || s[i] == '>') && depth > 0) {
            if (--depth == 0 && s[i] == ')' && open != SIZE_MAX)
                at = open, len = i - open + 1;
            if (depth == 0)
                open = SIZE_MAX;
        }
    }
    if (len <= 5)
        return 0;
    splice(s, at, len, "(...)", 5);
    return 1;
}

/* Collapses every template argument list that opens at depth d (1: the
 * outermost) and is longer than "<...>", in one pass: each collapse of
 * collapse_template rescans the name, which is quadratic in a name of
 * hundreds of KiB (deeply templated C++ makes them). */
static void collapse_depth(char *s, size_t d) {
    size_t n = strlen(s);
    char *src = malloc(n + 1);
    if (!src)
        return; /* left to collapse_template */
    memcpy(src, s, n + 1);
    size_t w = 0, depth = 0, open_w = 0, open_i = 0;
    for (size_t i = 0; i < n; i++) {
        s[w++] = src[i];
        if ((src[i] != '<' && src[i] != '>') || operator_char(src, i))
            continue;
        if (src[i] == '<' && ++depth == d) {
            open_w = w - 1, open_i = i;
        } else if (src[i] == '>' && depth > 0 && depth-- == d && i - open_i + 1 > 5) {
            memcpy(s + open_w, "<...>", 5); /* the list's copy was longer: it fits */
            w = open_w + 5;
        }
    }
    s[w] = '\0';
    free(src);
}

size_t mt_name_fit(char *s, size_t max) {
    size_t n = strlen(s);
    /* A name many times too long loses its inner lists a level at a time
     * first; what is left is then shortened as below. */
    for (size_t d = 2; d >= 1 && n > 4 * max; d--) {
        collapse_depth(s, d);
        n = strlen(s);
    }
    while (n > max && collapse_template(s))
        n = strlen(s);
    if (n > max && collapse_arguments(s))
        n = strlen(s);
    if (n > max && max >= 4) {
        size_t from = n - (max - 3);
        while (from < n && ((unsigned char)s[from] & 0xC0) == 0x80) /* not inside a character */
            from++;
        memmove(s + 3, s + from, n - from + 1);
        memcpy(s, "...", 3);
        n = 3 + (n - from);
    } else if (n > max) {
        s[max] = '\0';
        n = max;
    }
    return n;
}

size_t mt_text_cut(const char *s, size_t max) {
    if (!s)
        return 0;
    size_t n = strnlen(s, max);
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) /* s[n] continues s[n - 1]'s */
        n--;
    return n;
}
