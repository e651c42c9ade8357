//! The `gpushare` tools' shared part: the command line's definition ([`cli`]), which the
//! `gpushare` binary parses and `gpushare-gen` turns into man pages and completions.

pub mod cli;
