//! What the CLI prints on stdout. `println!` panics when the reader went
//! away (`engram memories list | head` closes the pipe, and Rust ignores
//! SIGPIPE, so the write fails with EPIPE); these return the io error
//! instead, and the binary's `main` ends quietly with success when the
//! error is a closed pipe ([`is_broken_pipe`]).

use std::io::Write;

/// `text` to stdout, flushed; an error (a closed pipe among them) is
/// returned, never a panic.
pub fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// [`print`] with a newline.
pub fn print_line(text: impl std::fmt::Display) -> std::io::Result<()> {
    print(&format!("{text}\n"))
}

/// `println!` that returns `std::io::Result<()>` instead of panicking.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::print_line(format_args!($($arg)*))
    };
}

/// True when `e`, or any error it wraps, is a write to a reader that went
/// away: the output was not wanted any more, so nothing failed.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_pipe_is_a_broken_pipe() {
        let pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(is_broken_pipe(&anyhow::Error::from(pipe)));
        let wrapped = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing the listing");
        assert!(is_broken_pipe(&wrapped));
        let other = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(!is_broken_pipe(&anyhow::Error::from(other)));
        assert!(!is_broken_pipe(&anyhow::anyhow!("broken pipe")));
    }
}
