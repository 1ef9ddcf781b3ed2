// Python's whitespace rules, as Jinja's trim applies them to chat messages.
#include "model/python_whitespace.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace pdserve::model {
namespace {

TEST(PythonWhitespaceTest, SetIsStrIsspace) {
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Du, 0x1Cu, 0x1Fu, 0x20u, 0x85u, 0xA0u,
                      0x1680u, 0x2000u, 0x200Au, 0x2028u, 0x202Fu, 0x3000u}) {
    EXPECT_TRUE(IsPyWhitespace(cp)) << cp;
  }
  for (uint32_t cp : {0x08u, 0x21u, 0x200Bu, 0xFEFFu, 0x180Eu}) {
    EXPECT_FALSE(IsPyWhitespace(cp)) << cp;
  }
}

TEST(PythonWhitespaceTest, Strip) {
  EXPECT_EQ(PyStrip(" \t\n hi there \r\n"), "hi there");
  // U+001F (unit separator), U+00A0 and U+3000 are stripped; U+200B is not.
  EXPECT_EQ(PyStrip("\x1F\xC2\xA0x\xE3\x80\x80"), "x");
  EXPECT_EQ(PyStrip("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");
  EXPECT_EQ(PyStrip("   "), "");
  EXPECT_EQ(PyStrip(""), "");
  // Invalid UTF-8 is not whitespace: it ends the run.
  EXPECT_EQ(PyStrip(" \xFF "), "\xFF");
  EXPECT_EQ(PyWhitespaceRunAt("a  b", 1), 2u);
  EXPECT_EQ(PyTrailingWhitespaceStart("ab \xC2\xA0"), 2u);
}

}  // namespace
}  // namespace pdserve::model
