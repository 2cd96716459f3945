/* Environment parsing: garbage falls back to defaults, ranges clamp. */
#include <string.h>

#include "check.h"
#include "config.h"
#include "mtrace_api.h"

int main(void) {
    CHECK_EQ(mt_parse_depth(NULL), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth(""), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth("abc"), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth("-1"), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth("12x"), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth("0"), 1);
    CHECK_EQ(mt_parse_depth("16"), 16);
    CHECK_EQ(mt_parse_depth("100000"), MTRACE_MAX_DEPTH);
    CHECK_EQ(mt_parse_depth("99999999999999999999999"), MTRACE_MAX_DEPTH);

    CHECK_EQ(mt_parse_enabled(NULL), 1);
    CHECK_EQ(mt_parse_enabled("1"), 1);
    CHECK_EQ(mt_parse_enabled("0"), 0);
    CHECK_EQ(mt_parse_enabled("false"), 0);
    CHECK_EQ(mt_parse_enabled("garbage"), 1);

    CHECK(mt_program_listed("beam.smp", "beam.smp"));
    CHECK(!mt_program_listed("beam.smp", "beam"));
    CHECK(!mt_program_listed("beam.smp", "sh"));
    CHECK(mt_program_listed("sh, beam.smp", "beam.smp"));
    CHECK(mt_program_listed("*", "anything"));
    CHECK(mt_program_listed("a,*", "x"));
    CHECK(!mt_program_listed("", "x"));
    CHECK(!mt_program_listed(",,", "x"));
    return check_summary();
}
