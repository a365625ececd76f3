use super::*;
use std::io::Write;

#[test]
fn klog_file_flags_pick_the_sink() {
    assert_eq!(
        FileSink::from_klog("konnectivity-server", true, "/x.log", "", 1, false),
        None,
        "logtostderr wins, as klog"
    );
    let sink =
        FileSink::from_klog("konnectivity-server", false, "", "/var/log/k", 2, true).unwrap();
    assert_eq!(
        sink.path,
        std::path::Path::new("/var/log/k/konnectivity-server.log")
    );
    assert_eq!(sink.max_bytes, 2 << 20);
    assert_eq!(
        FileSink::from_klog("konnectivity-server", false, "", "", 1, false),
        None
    );
}

#[test]
fn the_file_starts_over_at_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink {
        path: dir.path().join("log"),
        max_bytes: 100,
        also_stderr: false,
    };
    let mut file = open_capped(&sink).unwrap();
    for _ in 0..10 {
        file.write_all(&[b'x'; 30]).unwrap();
    }
    file.write_all(b"last").unwrap();
    file.flush().unwrap();
    let text = std::fs::read(&sink.path).unwrap();
    assert!(text.len() <= 100, "{}", text.len());
    assert!(
        text.ends_with(b"last"),
        "the newest write is kept after the restart: {text:?}"
    );
}

#[test]
fn go_quoting_matches_strconv_quote() {
    let mut out = String::new();
    go_quote("a \"b\"\\\n\t\x01\x7f\u{85}é", &mut out);
    assert_eq!(out, r#""a \"b\"\\\n\t\x01\x7f\u0085é""#);
}

#[test]
fn multi_line_values_use_klogs_block() {
    let mut out = String::new();
    push_string_value(&mut out, "one\ntwo");
    assert_eq!(out, "=<\n\tone\n\ttwo\n >");
    let mut out = String::new();
    push_string_value(&mut out, "one\n");
    assert_eq!(out, "=<\n\tone\n >");
}

#[test]
fn vmodule_matches_file_names_like_klog() {
    let filters = parse_vmodule("dispatch=5,http_*=6,backend::session=3,frontend/grpc.rs=2");
    assert_eq!(
        filters,
        vec![
            ("dispatch".to_string(), 5),
            ("http_*".to_string(), 6),
            ("session".to_string(), 3),
            ("grpc".to_string(), 2),
        ]
    );
    assert!(glob_match(b"http_*", b"http_connect"));
    assert!(glob_match(b"d?al", b"dial"));
    assert!(!glob_match(b"dial", b"dialer"));
    assert_eq!(module_of("src/frontend/http_connect.rs"), "http_connect");
}
