//! The tokens of the IR's text: identifiers, numbers, punctuation, with
//! their byte offsets for messages.

use super::{ParseError, Result};

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Kind {
    Ident,
    Int(u128),
    Float(f64),
    Punct(&'static str),
    Eof,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Tok {
    pub(super) kind: Kind,
    pub(super) start: usize,
    pub(super) end: usize,
}

/// Longest first, so that `..=` is not read as `..` then `=`.
pub(super) const PUNCTS: &[&str] = &[
    "<<=", ">>=", "..=", "..", "::", "==", "!=", "<=", ">=", "<<", ">>", "&&", "||", "+=", "-=",
    "*=", "/=", "%=", "&=", "|=", "^=", "(", ")", "[", "]", "{", "}", ",", ";", ":", ".", "=", "!",
    "<", ">", "+", "-", "*", "/", "%", "&", "|", "^",
];

/// Rust's numeric suffixes, taken and ignored as the macro does (`f32`/`f64`
/// make an integer a float).
pub(super) const SUFFIXES: &[&str] = &[
    "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "isize", "usize", "f32", "f64",
];

pub(super) fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

pub(super) fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

pub(super) fn lex(src: &str) -> Result<Vec<Tok>> {
    let mut toks = Vec::new();
    let mut i = 0;
    while let Some(c) = src.get(i..).and_then(|s| s.chars().next()) {
        let rest = src.get(i..).unwrap_or("");
        if c.is_whitespace() {
            i += c.len_utf8();
        } else if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if is_ident_start(c) {
            let len = rest
                .char_indices()
                .find(|&(_, c)| !is_ident_char(c))
                .map_or(rest.len(), |(j, _)| j);
            toks.push(Tok {
                kind: Kind::Ident,
                start: i,
                end: i + len,
            });
            i += len;
        } else if c.is_ascii_digit() {
            let (kind, len) = lex_number(src, i)?;
            toks.push(Tok {
                kind,
                start: i,
                end: i + len,
            });
            i += len;
        } else if let Some(p) = PUNCTS.iter().find(|p| rest.starts_with(**p)) {
            toks.push(Tok {
                kind: Kind::Punct(p),
                start: i,
                end: i + p.len(),
            });
            i += p.len();
        } else {
            return Err(error_at(
                src,
                i,
                format!(
                    "unexpected character `{c}` (the DSL has names, numbers and Rust's operators)"
                ),
            ));
        }
    }
    toks.push(Tok {
        kind: Kind::Eof,
        start: src.len(),
        end: src.len(),
    });
    Ok(toks)
}

/// The number starting at byte `at` of `src`: its token and its length.
pub(super) fn lex_number(src: &str, at: usize) -> Result<(Kind, usize)> {
    let rest = src.get(at..).unwrap_or("");
    let b = rest.as_bytes();
    let digits = |from: usize, ok: &dyn Fn(u8) -> bool| {
        let mut j = from;
        while b.get(j).is_some_and(|&c| ok(c) || c == b'_') {
            j += 1;
        }
        j
    };
    let bad = |msg: String| error_at(src, at, msg);
    let radix = match (b.first(), b.get(1)) {
        (Some(b'0'), Some(b'x')) => 16,
        (Some(b'0'), Some(b'o')) => 8,
        (Some(b'0'), Some(b'b')) => 2,
        _ => 10,
    };
    let (mut end, mut float) = if radix != 10 {
        (digits(2, &|c: u8| (c as char).is_digit(radix)), false)
    } else {
        let mut j = digits(0, &|c: u8| c.is_ascii_digit());
        let mut float = false;
        // `1.5`, not `0..n` nor `1.cast()`: a fraction needs a digit after the dot.
        if b.get(j) == Some(&b'.') && b.get(j + 1).is_some_and(u8::is_ascii_digit) {
            j = digits(j + 1, &|c: u8| c.is_ascii_digit());
            float = true;
        }
        if matches!(b.get(j), Some(b'e' | b'E')) {
            let k = if matches!(b.get(j + 1), Some(b'+' | b'-')) {
                j + 2
            } else {
                j + 1
            };
            if b.get(k).is_some_and(u8::is_ascii_digit) {
                j = digits(k, &|c: u8| c.is_ascii_digit());
                float = true;
            }
        }
        (j, float)
    };
    let body: String = rest
        .get(if radix == 10 { 0 } else { 2 }..end)
        .unwrap_or("")
        .chars()
        .filter(|&c| c != '_')
        .collect();
    let suffix_len = rest
        .get(end..)
        .unwrap_or("")
        .char_indices()
        .find(|&(_, c)| !is_ident_char(c))
        .map_or(rest.len() - end, |(j, _)| j);
    let suffix = rest.get(end..end + suffix_len).unwrap_or("");
    if !suffix.is_empty() {
        if !SUFFIXES.contains(&suffix) {
            return Err(bad(format!(
                "unexpected `{suffix}` after the number `{}`",
                rest.get(..end).unwrap_or("")
            )));
        }
        float |= suffix.starts_with('f');
        end += suffix_len;
    }
    let text = rest.get(..end).unwrap_or("");
    if body.is_empty() {
        return Err(bad(format!("`{text}` has no digits")));
    }
    let kind = if float {
        match body.parse::<f64>() {
            Ok(v) => Kind::Float(v),
            Err(_) => return Err(bad(format!("`{text}` is not a number"))),
        }
    } else {
        match u128::from_str_radix(&body, radix) {
            Ok(v) => Kind::Int(v),
            Err(_) => return Err(bad(format!("the integer `{text}` is too large"))),
        }
    };
    Ok((kind, end))
}

/// An error at byte `at` of `src`, with its line and column.
pub(super) fn error_at(src: &str, at: usize, message: String) -> ParseError {
    let before = src.get(..at).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |j| j + 1);
    let column = before.get(line_start..).unwrap_or("").chars().count() + 1;
    ParseError {
        line,
        column,
        message,
    }
}
