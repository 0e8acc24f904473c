//! The Kubernetes manifests in `deploy/kubernetes` hold together: the `sluice.toml` of the
//! ConfigMap loads and may be served on its public addresses, every `env:` secret it names
//! reaches the container from the Secret, probes and ports match the listeners, the Service,
//! ServiceMonitor and PodDisruptionBudget select the pods, and the Envoy gateway's
//! configuration passes Envoy's own validation and points at the sluice Service.
//! (`scripts/test-deploy` checks every file against the Kubernetes schemas.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml::Value;
use sluice_server::config::{CheckOptions, Config};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Every document of every YAML file, by `kind/name`.
fn resources() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap();
            let kind = v["kind"].as_str().unwrap().to_string();
            let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
            out.insert(format!("{kind}/{name}"), v);
        }
    }
    out
}

fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, found {v:?}"))
}

#[test]
fn the_kubernetes_manifests_fit_together() {
    let r = resources();
    let config_map = &r["ConfigMap/sluice-config"];
    let deployment = &r["Deployment/sluice"];
    let service = &r["Service/sluice"];
    let secret = &r["Secret/sluice-tokens"];

    // The ConfigMap's files, written where the Deployment mounts them, load as sluice serve
    // loads them, and their public listeners pass the exposure rule.
    let mount = tempfile_dir();
    for (name, text) in config_map["data"].as_mapping().unwrap() {
        std::fs::write(mount.join(s(name)), s(text)).unwrap();
    }
    let toml_text = s(&config_map["data"]["sluice.toml"]);
    let config = Config::load_with(
        &mount.join("sluice.toml"),
        CheckOptions {
            skip_env_secrets: true,
        },
    )
    .unwrap_or_else(|e| panic!("the ConfigMap's sluice.toml does not load: {e}"));
    config
        .check_exposure()
        .unwrap_or_else(|e| panic!("sluice serve would refuse the ConfigMap's listeners: {e}"));

    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    assert_eq!(args, ["serve", "--config", "/etc/sluice/sluice.toml"]);
    let mounted = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| s(&m["mountPath"]) == "/etc/sluice")
        .expect("the config is mounted at /etc/sluice");
    let volume = pod["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mounted["name"])
        .unwrap();
    assert_eq!(s(&volume["configMap"]["name"]), "sluice-config");

    // Every env: secret of the file comes from the Secret.
    let named: BTreeSet<&str> = toml_text
        .split('"')
        .filter_map(|t| t.strip_prefix("env:"))
        .collect();
    assert!(!named.is_empty());
    let secret_keys: BTreeSet<&str> = secret["stringData"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(s)
        .collect();
    let env: BTreeMap<&str, &Value> = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| (s(&e["name"]), e))
        .collect();
    for var in &named {
        let from = &env
            .get(var)
            .unwrap_or_else(|| panic!("{var} is named in sluice.toml but not set"))["valueFrom"]["secretKeyRef"];
        assert_eq!(s(&from["name"]), "sluice-tokens");
        assert!(secret_keys.contains(s(&from["key"])), "{var}: no such key");
    }

    // Container ports are the listeners' ports; probes use the health endpoints on http.
    let ports: BTreeMap<&str, u64> = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| (s(&p["name"]), p["containerPort"].as_u64().unwrap()))
        .collect();
    assert_eq!(ports["http"], u64::from(config.server.http.port()));
    assert_eq!(ports["grpc"], u64::from(config.server.grpc.port()));
    let admin = config.server.admin.expect("an admin listener");
    assert_eq!(ports["admin"], u64::from(admin.port()));
    assert_eq!(
        s(&container["readinessProbe"]["httpGet"]["path"]),
        "/readyz"
    );
    assert_eq!(
        s(&container["livenessProbe"]["httpGet"]["path"]),
        "/healthz"
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(s(&container[probe]["httpGet"]["port"]), "http");
    }
    assert!(
        container["securityContext"]["readOnlyRootFilesystem"]
            .as_bool()
            .unwrap()
    );
    assert!(
        pod["spec"]["securityContext"]["runAsNonRoot"]
            .as_bool()
            .unwrap()
    );

    // The Service, ServiceMonitor and PDB select the pods and name real ports.
    let labels = &pod["metadata"]["labels"];
    let selects = |selector: &Value| {
        selector
            .as_mapping()
            .unwrap()
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(selects(&service["spec"]["selector"]));
    assert!(selects(&deployment["spec"]["selector"]["matchLabels"]));
    let pdb = &r["PodDisruptionBudget/sluice"];
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"]));
    assert!(
        pdb["spec"]["minAvailable"].as_u64().unwrap()
            < deployment["spec"]["replicas"].as_u64().unwrap()
    );
    let service_ports: BTreeMap<&str, &Value> = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| (s(&p["name"]), p))
        .collect();
    for (name, p) in &service_ports {
        assert_eq!(s(&p["targetPort"]), *name);
        assert!(ports.contains_key(name), "service port {name}");
    }
    let monitor = &r["ServiceMonitor/sluice"];
    let service_labels = &service["metadata"]["labels"];
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(service_labels.get(k), Some(v));
    }
    let scrape = &monitor["spec"]["endpoints"][0];
    assert_eq!(
        s(&scrape["port"]),
        "admin",
        "metrics live on the admin listener"
    );
    assert_eq!(s(&scrape["path"]), "/metrics");
    assert!(secret_keys.contains(s(&scrape["bearerTokenSecret"]["key"])));

    // The Envoy gateway asks the sluice Service's gRPC port for the domain sluice serves.
    let envoy_text = s(&r["ConfigMap/envoy-gateway"]["data"]["envoy.yaml"]);
    let envoy: Value = serde_yaml::from_str(envoy_text).unwrap();
    let cluster = envoy["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| s(&c["name"]) == "sluice")
        .unwrap();
    let addr = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    assert_eq!(s(&addr["address"]), "sluice");
    assert_eq!(
        addr["port_value"].as_u64(),
        service_ports["grpc"]["port"].as_u64()
    );
    let limits: Value = serde_yaml::from_str(s(&config_map["data"]["ratelimit.yaml"])).unwrap();
    assert!(envoy_text.contains(&format!("domain: {}", s(&limits["domain"]))));

    // Envoy itself accepts the gateway's configuration.
    if let Ok(envoy_bin) = std::env::var("SLUICE_ENVOY") {
        std::fs::write(mount.join("envoy.yaml"), envoy_text).unwrap();
        let out = std::process::Command::new(envoy_bin)
            .args(["--mode", "validate", "-c"])
            .arg(mount.join("envoy.yaml"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "envoy --mode validate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&mount);
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
