/* mt_name_fit: long C++ names keep the function's own name. */
#include <string.h>

#include "check.h"
#include "name_fit.h"

/* Fits a copy of name into max bytes; the result in out. */
static size_t fit(const char *name, size_t max, char *out, size_t cap) {
    snprintf(out, cap, "%s", name);
    return mt_name_fit(out, max);
}

static int is(const char *got, const char *want) {
    if (strcmp(got, want) == 0)
        return 1;
    fprintf(stderr, "got  '%s'\nwant '%s'\n", got, want);
    return 0;
}

/* Two methods of one class whose template arguments alone pass the limit:
 * cutting the end made them one name. */
static void methods_stay_apart(void) {
    char args[1024] = "", a[2048], b[2048];
    for (int i = 0; i < 20; i++)
        strcat(args,
               i ? ", std::map<std::string, std::string>" : "std::map<std::string, std::string>");
    snprintf(a, sizeof a, "engine::Table<%s>::grow_bucket_array(unsigned long)", args);
    snprintf(b, sizeof b, "engine::Table<%s>::intern_key_string(char const*)", args);
    CHECK(mt_name_fit(a, 511) <= 511 && mt_name_fit(b, 511) <= 511);
    CHECK(strstr(a, "::grow_bucket_array(unsigned long)") != NULL);
    CHECK(strstr(b, "::intern_key_string(char const*)") != NULL);
    CHECK(strcmp(a, b) != 0);
}

/* The longest innermost list goes first, as Mtrace.Frame.fit/2 does it. */
static void as_the_report_does(void) {
    char out[256];
    fit("Asm::emit_body<unsigned long (process*, unsigned long)>", 30, out, sizeof out);
    CHECK(is(out, "Asm::emit_body<...>"));
    fit("std::map<int, std::vector<char> >::insert", 40, out, sizeof out);
    CHECK(is(out, "std::map<int, std::vector<...> >::insert"));
    fit("std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>", 40, out,
        sizeof out);
    CHECK(is(out, "std::vector<...>::_M_realloc_insert<...>"));
}

/* An operator's "<" or ">" is no bracket. */
static void operators(void) {
    char out[256];
    fit("std::ostream& operator<< <char, std::char_traits<char> >(std::ostream&, char)", 60, out,
        sizeof out);
    CHECK(is(out, "std::ostream& operator<< <...>(std::ostream&, char)"));
    fit("bool ns::operator< <long long>(ns::X<long long> const&)", 43, out, sizeof out);
    CHECK(is(out, "bool ns::operator< <...>(ns::X<...> const&)"));
    fit("ns::It<std::vector<int> >::operator->() const", 31, out, sizeof out);
    CHECK(is(out, "ns::It<...>::operator->() const"));
    fit("ns::Shift<int>::operator>>=(ns::Shift<long>&)", 40, out, sizeof out);
    CHECK(is(out, "ns::Shift<int>::operator>>=(...)")); /* "<int>" is no longer as "<...>" */
}

/* Then the arguments; then the start, at a character's beginning. */
static void arguments_then_the_start(void) {
    char out[256];
    fit("ns::f(std::vector<int>, long, unsigned char const*)", 30, out, sizeof out);
    CHECK(is(out, "ns::f(...)"));
    size_t n = fit("ns::f_with_a_very_long_name_indeed_that_goes_on()", 20, out, sizeof out);
    CHECK_EQ(n, 20);
    CHECK(is(out, "...ed_that_goes_on()"));
    n = fit("ns::\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9()", 10, out, sizeof out);
    CHECK(n <= 10 && strncmp(out, "...", 3) == 0);
    CHECK(((unsigned char)out[3] & 0xC0) != 0x80); /* starts a character */
    n = fit("short_enough", 12, out, sizeof out);
    CHECK(n == 12 && is(out, "short_enough"));
}

/* A name of hundreds of KiB (deeply templated C++) is shortened in a few
 * passes, not one pass a template list. */
static void very_long(void) {
    size_t cap = 300000;
    char *name = malloc(cap);
    if (!name)
        return;
    size_t n = (size_t)snprintf(name, cap, "ns::T<");
    while (n < cap - 100)
        n += (size_t)snprintf(name + n, cap - n, "X<int, Y<long> >, ");
    snprintf(name + n - 2, cap - n + 2, ">::grow(unsigned long)");
    CHECK(mt_name_fit(name, 511) <= 511);
    CHECK(is(name, "ns::T<...>::grow(unsigned long)"));
    free(name);
}

int main(void) {
    methods_stay_apart();
    as_the_report_does();
    operators();
    arguments_then_the_start();
    very_long();
    return check_summary();
}
