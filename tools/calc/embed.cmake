# Turns one file into a C source defining a NUL-terminated char array, so
# the kvferry binary carries its data (reference figures, HTML pages)
# without the source tree. Run as:
#   cmake -DIN=<file> -DOUT=<file.c> -DSYM=<symbol> -P embed.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
# Break the line every 16 bytes (80 characters).
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)"
       "\\1\n" body "${body}")
file(WRITE "${OUT}.tmp"
  "/* Generated from ${IN} by tools/calc/embed.cmake; do not edit. */\n"
  "#include <stddef.h>\n"
  "extern const char ${SYM}[];\n"
  "extern const size_t ${SYM}_len;\n"
  "const size_t ${SYM}_len = ${len};\n"
  "const char ${SYM}[] = {\n${body}0x00};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
