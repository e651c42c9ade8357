//! The `gpushare` tools' shared part: the command line's definition ([`cli`]), which the
//! `gpushare` binary parses and `gpushare-gen` turns into man pages and completions; output
//! that ends quietly when its reader goes away ([`output`]); the broker socket ([`socket`]).

pub mod cli;
pub mod output;
pub mod socket;
