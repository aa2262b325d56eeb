//! Text that leaves linnet for people and other systems: commit messages, commit statuses,
//! events, logs and `/status`. Whoever can push to the repository chooses some of it (an
//! image, a name in an error), so it is made one printable, bounded line; and a URL's
//! credentials never leave at all.

/// Bidirectional and zero-width controls: printable in Rust's sense, but they make text read
/// differently from what it is.
pub fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

/// `text` as one line of at most `max` characters: line breaks, tabs and other control or
/// invisible characters become spaces, runs of spaces one space, and a longer line ends in `…`.
pub fn one_line(text: &str, max: usize) -> String {
    if max == 0 {
        return String::new();
    }
    let mut out = String::with_capacity(text.len().min(max * 4));
    let mut count = 0;
    let mut pending_space = false;
    for c in text.chars() {
        if c.is_whitespace() || c.is_control() || is_invisible(c) {
            pending_space = !out.is_empty();
            continue;
        }
        let needed = usize::from(pending_space) + 1;
        if count + needed > max {
            // Room for the ellipsis: drop characters until it fits.
            while count + 1 > max {
                if out.pop().is_none() {
                    break;
                }
                count -= 1;
            }
            let trimmed = out.trim_end().len();
            out.truncate(trimmed);
            out.push('…');
            return out;
        }
        if pending_space {
            out.push(' ');
            count += 1;
            pending_space = false;
        }
        out.push(c);
        count += 1;
    }
    out
}

/// `text` with every `scheme://user:secret@` in it written `scheme://user:***@`, and every
/// `scheme://token@` written `scheme://***@` (a token alone is a secret too). For log lines and
/// error messages that may quote a URL.
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // User information ends at the last `@` of the URL (a raw token may hold `/`, `?` or
        // `#`); the URL ends at whitespace or a quote. A path with an `@` in it is hidden
        // too: better too much than a token.
        let end = after
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'')
            .unwrap_or(after.len());
        let url = &after[..end];
        match url.rfind('@') {
            Some(userinfo_end) => {
                let userinfo = &url[..userinfo_end];
                match userinfo.split_once(':') {
                    Some((user, _)) if !user.contains(['/', '?', '#']) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    _ => out.push_str("***"),
                }
                out.push_str(&url[userinfo_end..]);
            }
            None => out.push_str(url),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// `text` percent-encoded as one URL path segment or query value: everything but RFC 3986's
/// unreserved characters.
pub fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_percent_encoded_as_one_value() {
        assert_eq!(
            percent_encoded("sum(rate(x{a=\"b\"}[1m])) / 2"),
            "sum%28rate%28x%7Ba%3D%22b%22%7D%5B1m%5D%29%29%20%2F%202"
        );
        assert_eq!(percent_encoded("group/name"), "group%2Fname");
    }

    #[test]
    fn a_newline_cannot_forge_a_trailer() {
        let image = "redis:7.4\n\nSigned-off-by: Mallory <m@example.com>";
        assert_eq!(
            one_line(image, 200),
            "redis:7.4 Signed-off-by: Mallory <m@example.com>"
        );
    }

    #[test]
    fn long_text_is_cut_with_an_ellipsis() {
        let long = "x".repeat(60_000);
        let line = one_line(&long, 200);
        assert_eq!(line.chars().count(), 200);
        assert!(line.ends_with('…'));
        assert_eq!(one_line("abc", 3), "abc");
        assert_eq!(one_line("abcd", 3), "ab…");
        assert_eq!(one_line("ab  cd", 4), "ab…");
    }

    #[test]
    fn controls_and_invisibles_become_spaces() {
        assert_eq!(one_line("a\u{202E}b\tc\r\nd\u{0}e", 50), "a b c d e");
        assert_eq!(one_line("  lead and trail  ", 50), "lead and trail");
    }

    #[test]
    fn credentials_in_urls_are_redacted() {
        assert_eq!(
            redact_credentials("https://user:TOKEN@git.example.com/a/b.git"),
            "https://user:***@git.example.com/a/b.git"
        );
        assert_eq!(
            redact_credentials("https://TOKEN@github.com/a/b"),
            "https://***@github.com/a/b"
        );
        assert_eq!(
            redact_credentials("ssh://git@host:22/a"),
            "ssh://***@host:22/a",
            "a user name alone is hidden too: it may be a token"
        );
        assert_eq!(
            redact_credentials("cannot reach http://u:p@h/x: refused; also http://h/y"),
            "cannot reach http://u:***@h/x: refused; also http://h/y"
        );
        assert_eq!(
            redact_credentials("git@github.com:a/b.git"),
            "git@github.com:a/b.git"
        );
        assert_eq!(redact_credentials("/srv/git/repo.git"), "/srv/git/repo.git");
    }
}
