//! `kiln chat` end to end over stdin: turns after the first prefill only what
//! the cache lacks, `/reset` starts over, `/exit` and end of input quit.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn chat(input: &str) -> (bool, String, String) {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/fixtures/tiny/llama/gguf/llama-f32.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["chat", "--temp", "0", "-n", "5", "-t", "1"])
        .arg(&model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The "(N reused from cache)" count of every turn, in order.
fn reused(stderr: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter_map(|l| {
            l.split(" reused from cache")
                .next()
                .filter(|_| l.contains("reused from cache"))
        })
        .filter_map(|head| head.rsplit('(').next()?.trim().parse().ok())
        .collect()
}

#[test]
fn later_turns_reuse_the_cache_and_reset_clears_it() {
    let (ok, _out, err) = chat("hello there\nand again\n/reset\nhello there\n/exit\n");
    assert!(ok, "{err}");
    let r = reused(&err);
    assert_eq!(r.len(), 3, "{err}");
    assert_eq!(r[0], 0, "first turn has nothing cached: {err}");
    assert!(
        r[1] > 10,
        "second turn must reuse the first turn's tokens: {err}"
    );
    assert_eq!(r[2], 0, "after /reset nothing is cached: {err}");
    assert!(err.contains("(conversation reset)"));
}

#[test]
fn end_of_input_quits_cleanly() {
    let (ok, _out, err) = chat("hi\n");
    assert!(ok, "{err}");
    assert_eq!(reused(&err), vec![0]);
}
