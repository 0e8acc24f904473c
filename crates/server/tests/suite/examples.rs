//! Every example configuration in the repository is valid.

use std::path::PathBuf;

use sluice_server::Config;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn example_configurations_validate() {
    let mut checked = 0;
    for dir in ["examples", "examples/envoy"] {
        for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml")
                && path.file_name().is_some_and(|n| n != "Cargo.toml")
            {
                if let Err(e) = Config::load(&path) {
                    panic!("{} is invalid:\n{e}", path.display());
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "{checked}");
    let yaml = repo().join("examples/ratelimit-edge.yaml");
    let text = std::fs::read_to_string(&yaml).unwrap();
    sluice_server::config::load_domain_yaml(&text, "ratelimit-edge.yaml").unwrap();
}

#[test]
fn validate_exits_non_zero_with_file_and_line() {
    let dir = std::env::temp_dir().join(format!("sluice-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate = \"5/x\"\n",
    )
    .unwrap();
    let code = sluice_server::cli::validate(sluice_server::cli::ValidateArgs {
        config: file.clone(),
        no_secrets: false,
    });
    assert_eq!(code, std::process::ExitCode::from(1));
    let err = Config::load(&file).unwrap_err().to_string();
    assert_eq!(
        err.lines()
            .next()
            .unwrap()
            .split(": invalid rate")
            .next()
            .unwrap(),
        format!("{}:4: policies.a.rate", file.display())
    );
    let good = dir.join("good.toml");
    std::fs::write(&good, "").unwrap();
    assert_eq!(
        sluice_server::cli::validate(sluice_server::cli::ValidateArgs {
            config: good,
            no_secrets: false
        }),
        std::process::ExitCode::SUCCESS
    );
    // An env: secret whose variable is unset fails, unless the secrets are skipped.
    let secret = dir.join("secret.toml");
    std::fs::write(
        &secret,
        "admin_token = \"env:SLUICE_TEST_UNSET_EXAMPLE_TOKEN\"\n",
    )
    .unwrap();
    let validate = |no_secrets| {
        sluice_server::cli::validate(sluice_server::cli::ValidateArgs {
            config: secret.clone(),
            no_secrets,
        })
    };
    assert_eq!(validate(false), std::process::ExitCode::from(1));
    assert_eq!(validate(true), std::process::ExitCode::SUCCESS);
    std::fs::remove_dir_all(&dir).ok();
}
