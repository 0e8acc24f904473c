//! The fuzz targets of `fuzz/` as ordinary tests: every input under `tests/fuzz-regressions/
//! <target>/` (crashes found by `scripts/fuzz`, kept forever) and a few thousand random inputs
//! per target, so CI checks the same invariants without a nightly toolchain.

use proptest::prelude::*;
use sluice_reliability::fuzzing::{self, TARGETS};

#[test]
fn saved_inputs_replay() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    let mut n = 0;
    for (name, target) in TARGETS {
        let Ok(dir) = std::fs::read_dir(root.join(name)) else {
            continue;
        };
        for f in dir.flatten() {
            let data = std::fs::read(f.path()).unwrap();
            eprintln!("replaying {}", f.path().display());
            target(&data);
            n += 1;
        }
    }
    eprintln!("{n} saved inputs replayed");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn algorithms(data in proptest::collection::vec(any::<u8>(), 0..700)) {
        fuzzing::algorithms(&data);
    }

    #[test]
    fn headers(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        fuzzing::headers(&data);
    }

    #[test]
    fn forwarded(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        fuzzing::forwarded(&data);
    }

    #[test]
    fn forwarded_text(peer in any::<u8>(), mode in any::<u8>(), v in "[0-9a-f:.,; \\[\\]\"=forFOR_unknown-]{0,120}") {
        let mut data = vec![peer, mode, 3, 1, 1];
        data[4] = v.len().min(200) as u8;
        data.extend_from_slice(v.as_bytes());
        fuzzing::forwarded(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn config(src in "(\\[[a-z.\"]{0,20}\\]\n|[a-z_]{1,12} = (\"[^\"\n]{0,12}\"|[0-9-]{1,22}|true|\\[\\]|\\{\\})\n|#.*\n|[^\n]{0,30}\n){0,12}") {
        fuzzing::config(src.as_bytes());
    }

    #[test]
    fn config_policies(alg in "token-bucket|gcra|leaky-bucket|fixed-window|sliding-counter|sliding-log|concurrency|x", key in "capacity|rate|burst|limit|window|mode|lease|shards|identity", val in "\"[0-9a-z/]{0,8}\"|-?[0-9]{1,21}") {
        let src = format!("[policies.p]\nalgorithm = \"{alg}\"\n{key} = {val}\n");
        fuzzing::config(src.as_bytes());
    }

    #[test]
    fn api_json(body in "\\{(\"(policy|policies|identity|cost|lease|x)\": (\"[a-c~%,{}]{0,6}\"|-?[0-9]{1,22}(\\.[0-9])?|\\[\"[abc]\"(, \"[abc]\")*\\]|null|true|\\{\\}), ){0,4}\"identity\": \"[^\"]{0,10}\"\\}") {
        fuzzing::api_json(body.as_bytes());
    }

    #[test]
    fn api_json_bytes(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        fuzzing::api_json(&data);
    }
}
