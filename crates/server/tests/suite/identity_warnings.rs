//! `sluice validate` and `sluice serve` warn about a route whose only identity is a value the
//! client chooses (cookie, query parameter, API key, header, bearer token: unverified, so a new
//! value is a new limit), and stay quiet once a per-IP or verified policy sits next to it.

use std::process::ExitCode;

use sluice_server::cli::{ValidateArgs, validate};
use sluice_server::config::Config;

fn config(identities: &[&str]) -> String {
    let mut toml = String::new();
    let mut names = Vec::new();
    for (i, identity) in identities.iter().enumerate() {
        toml.push_str(&format!(
            "[policies.p{i}]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1m\"\nidentity = {identity}\n\n"
        ));
        names.push(format!("\"p{i}\""));
    }
    toml.push_str(&format!(
        "[[routes]]\nprefix = \"/login\"\nmethods = [\"POST\"]\npolicies = [{}]\nupstream = \"http://127.0.0.1:9\"\n",
        names.join(", ")
    ));
    toml
}

fn warnings(identities: &[&str]) -> Vec<String> {
    Config::parse(&config(identities), "sluice.toml", None)
        .unwrap_or_else(|e| panic!("{e}"))
        .warnings()
}

#[test]
fn a_route_limited_only_by_client_chosen_values_is_warned_about() {
    for (identity, named) in [
        ("\"cookie:session\"", "cookie:session"),
        ("\"query:user\"", "query:user"),
        ("\"api-key:x-api-key\"", "api-key:x-api-key"),
        ("\"header:x-user\"", "header:x-user"),
        ("\"bearer\"", "bearer"),
        ("[\"ip\", \"cookie:session\"]", "[cookie:session]"),
    ] {
        let w = warnings(&[identity]);
        assert_eq!(w.len(), 1, "{identity}: {w:?}");
        assert!(w[0].contains("route \"/login\" (POST)"), "{}", w[0]);
        assert!(w[0].contains(named), "{identity}: {}", w[0]);
        assert!(w[0].contains("identity = \"ip\""), "{}", w[0]);
    }
    // Two client-chosen sources are still client-chosen: both are named.
    let w = warnings(&["\"cookie:session\"", "\"query:user\""]);
    assert!(w[0].contains("cookie:session, query:user"), "{}", w[0]);
}

#[test]
fn a_per_ip_or_global_policy_next_to_it_silences_the_warning() {
    assert!(warnings(&["\"ip\""]).is_empty());
    assert!(warnings(&["\"global\""]).is_empty());
    assert!(warnings(&["\"api-key:x-api-key\"", "\"ip\""]).is_empty());
    assert!(warnings(&["\"ip\"", "\"cookie:session\""]).is_empty());
}

#[test]
fn validate_still_succeeds_with_warnings() {
    let dir = std::env::temp_dir().join(format!("sluice-identity-warnings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sluice.toml");
    std::fs::write(&file, config(&["\"cookie:session\""])).unwrap();
    let code = validate(ValidateArgs {
        config: file,
        no_secrets: false,
    });
    assert_eq!(code, ExitCode::SUCCESS);
    let _ = std::fs::remove_dir_all(&dir);
}
