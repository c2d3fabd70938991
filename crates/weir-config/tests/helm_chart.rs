//! deploy/helm/weir: `helm lint` passes, and what `helm template` renders hangs together
//! with Weir itself: the ini in the ConfigMap loads with this crate's loader (as Weir
//! would load it), the container, Service and probe ports are the ini's `listen_port` and
//! `http_listen`, the probes and the scrape annotation point at paths Weir serves, the
//! userlist in the Secret parses as an auth_file at the path the ini names, and the pod's
//! grace period exceeds the preStop delay plus the drain timeout. Every rendering is also
//! decoded strictly into the Kubernetes API's Go types (deploy/helm/validate): no unknown
//! field, no value of the wrong type.
//!
//! Here, not in the root package's tests/, because it needs only this crate's loader: the
//! test builds in seconds instead of after all of Weir.
//!
//! helm comes from scripts/install-helm (scripts/test runs it and sets
//! WEIR_REQUIRE_HELM=1). Without helm these tests say so and pass, unless
//! WEIR_REQUIRE_HELM=1, where they fail.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chart_dir() -> PathBuf {
    repo_root().join("deploy/helm/weir")
}

/// The Kubernetes version to render and lint for. A helm built with `go install` (as
/// scripts/install-helm does) lacks the release build's linker flags and assumes
/// Kubernetes 1.20, below the chart's kubeVersion; `--kube-version` says which one.
const KUBE_VERSION: &str = "1.33.0";

fn runs(helm: &Path) -> bool {
    Command::new(helm)
        .args(["version", "--short"])
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).starts_with("v3."))
        .unwrap_or(false)
}

/// WEIR_HELM, else helm on PATH, else where `go install` puts it.
fn helm() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(h) = std::env::var_os("WEIR_HELM") {
        candidates.push(h.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("helm")));
    }
    if let Some(gopath) = std::env::var_os("GOPATH") {
        candidates.push(PathBuf::from(gopath).join("bin/helm"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join("go/bin/helm"));
    }
    let found = candidates.into_iter().find(|h| h.is_file() && runs(h));
    if found.is_none() {
        if std::env::var("WEIR_REQUIRE_HELM").as_deref() == Ok("1") {
            panic!("WEIR_REQUIRE_HELM=1 but no helm 3 was found: run scripts/install-helm");
        }
        eprintln!("helm 3 not found (scripts/install-helm installs it): chart test skipped");
    }
    found
}

/// deploy/helm/validate built with Go (cached by Go's build cache; helm's own build by
/// scripts/install-helm has already compiled the Kubernetes API packages it uses), or
/// None without Go (a failure when WEIR_REQUIRE_HELM=1).
fn validator() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weir-k8s-validate");
            let go = ["go", "/usr/local/go/bin/go"]
                .into_iter()
                .find(|g| Command::new(g).arg("version").output().is_ok());
            let Some(go) = go else {
                if std::env::var("WEIR_REQUIRE_HELM").as_deref() == Ok("1") {
                    panic!("WEIR_REQUIRE_HELM=1 but go, to build deploy/helm/validate, is missing");
                }
                eprintln!("go not found: rendered objects not checked against the API types");
                return None;
            };
            let build = Command::new(go)
                .args(["build", "-trimpath", "-o"])
                .arg(&out)
                .arg(".")
                .current_dir(repo_root().join("deploy/helm/validate"))
                .output()
                .expect("run go build");
            assert!(
                build.status.success(),
                "go build deploy/helm/validate:\n{}",
                String::from_utf8_lossy(&build.stderr)
            );
            Some(out)
        })
        .as_deref()
}

/// `helm template` of the chart with these extra arguments: its objects, or helm's error.
fn template(helm: &Path, args: &[&str]) -> Result<Vec<Value>, String> {
    let out = Command::new(helm)
        .arg("template")
        .arg("weir")
        .arg(chart_dir())
        .args(["--namespace", "pool", "--kube-version", KUBE_VERSION])
        .args(args)
        .output()
        .expect("run helm");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).expect("helm output is UTF-8");
    if let Some(validator) = validator() {
        let mut child = Command::new(validator)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run weir-k8s-validate");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write manifests");
        let v = child.wait_with_output().expect("weir-k8s-validate");
        if !v.status.success() {
            return Err(format!(
                "the Kubernetes API types refuse the rendered objects:\n{}",
                String::from_utf8_lossy(&v.stderr)
            ));
        }
    }
    let mut objects = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc).expect("helm output is YAML");
        if !v.is_null() {
            objects.push(v);
        }
    }
    Ok(objects)
}

fn render(helm: &Path, args: &[&str]) -> Vec<Value> {
    template(helm, args).unwrap_or_else(|e| panic!("helm template {args:?} failed:\n{e}"))
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().expect("kind").to_owned())
        .collect()
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let all: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(all.len(), 1, "exactly one {kind}");
    all[0]
}

fn find<'a>(objects: &'a [Value], kind: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind)
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Every label of `selector` is on `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let sel = selector.as_object().expect("selector is a map");
    !sel.is_empty() && sel.iter().all(|(k, v)| labels[k] == *v)
}

/// The values the chart was rendered with, as far as the checks need them.
struct Expect {
    drain_timeout: u64,
    pre_stop_delay: u64,
}

impl Expect {
    /// values.yaml's own.
    fn defaults() -> Expect {
        let values = chart_values();
        Expect {
            drain_timeout: num(&values["drainTimeoutSeconds"]),
            pre_stop_delay: num(&values["preStopDelaySeconds"]),
        }
    }
}

/// The routes Weir's HTTP endpoint serves, read from its router so that a renamed route
/// fails here (tests/metrics_http.rs checks what each route answers).
fn weir_serves(path: &str) -> bool {
    let router = std::fs::read_to_string(repo_root().join("src/metrics_http/mod.rs"))
        .expect("src/metrics_http/mod.rs");
    router.contains(&format!("\"{path}\" =>"))
}

/// What every rendering must satisfy; returns the loaded ini.
fn check(objects: &[Value], expect: &Expect) -> weir_config::Config {
    let cm = one(objects, "ConfigMap");
    let ini = cm["data"]["pgbouncer.ini"]
        .as_str()
        .expect("pgbouncer.ini in the ConfigMap");
    let config = weir_config::load_str(ini, Path::new("pgbouncer.ini"))
        .unwrap_or_else(|e| panic!("the chart's ini does not load: {e}\n{ini}"));
    assert!(config.notices.is_empty(), "notices: {:?}", config.notices);
    let g = &config.general;
    let http_listen = g.http_listen.as_deref().expect("http_listen is set");
    let http_port: u64 = http_listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("http_listen is host:port");
    let listen_port = u64::from(g.listen_port);
    assert!(
        g.listen_addr.iter().any(|a| a == "0.0.0.0" || a == "*"),
        "listens on the pod IP"
    );

    let deploy = one(objects, "Deployment");
    let pod = &deploy["spec"]["template"];
    let spec = &pod["spec"];
    let containers = spec["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let port_of = |name: &str| -> u64 {
        let ports = c["ports"].as_array().expect("container ports");
        num(&ports
            .iter()
            .find(|p| p["name"] == name)
            .expect("named port")["containerPort"])
    };
    // A probe or Service port is either a name of a container port or a number.
    let resolve = |port: &Value| -> u64 { port.as_str().map_or_else(|| num(port), port_of) };
    assert_eq!(
        port_of("postgres"),
        listen_port,
        "container port = listen_port"
    );
    assert_eq!(port_of("http"), http_port, "container port = http_listen's");

    // Probes: Weir's real routes, on the http_listen port.
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert!(weir_serves(path), "Weir serves {path}");
        assert_eq!(resolve(&get["port"]), http_port, "{probe} port");
    }
    let ann = &pod["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(ann["prometheus.io/port"], http_port.to_string());
    let metrics_path = ann["prometheus.io/path"].as_str().expect("scrape path");
    assert!(weir_serves(metrics_path), "Weir serves {metrics_path}");

    // The config file Weir is started with is the ConfigMap's.
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect();
    let config_arg = Path::new(*args.last().expect("config path argument"));
    let mount_of = |volume: &str| -> PathBuf {
        let mounts = c["volumeMounts"].as_array().expect("mounts");
        let m = mounts.iter().find(|m| m["name"] == volume).expect("mount");
        PathBuf::from(m["mountPath"].as_str().expect("mountPath"))
    };
    let volume = |name: &str| -> &Value {
        let vols = spec["volumes"].as_array().expect("volumes");
        vols.iter().find(|v| v["name"] == name).expect("volume")
    };
    assert_eq!(config_arg, mount_of("config").join("pgbouncer.ini"));
    assert_eq!(
        volume("config")["configMap"]["name"],
        cm["metadata"]["name"]
    );

    // auth_file is the Secret's key, where the Secret is mounted.
    let auth_file = g.auth_file.as_deref().expect("auth_file is set");
    assert_eq!(auth_file.parent(), Some(mount_of("auth").as_path()));
    let secret_vol = &volume("auth")["secret"];
    let key = auth_file
        .file_name()
        .and_then(|f| f.to_str())
        .expect("file name");
    if let Some(secret) = find(objects, "Secret") {
        assert_eq!(secret_vol["secretName"], secret["metadata"]["name"]);
        let text = secret["stringData"][key]
            .as_str()
            .expect("userlist in the Secret");
        let loaded = weir_config::parse_auth_file(text, auth_file);
        assert!(loaded.notices.is_empty(), "userlist: {:?}", loaded.notices);
        assert!(!loaded.users.is_empty(), "userlist has users");
    }

    // The Unix socket's directory is writable on the read-only root file system.
    if let Some(dir) = g.unix_socket_dir.as_deref().filter(|d| !d.is_empty()) {
        assert_eq!(mount_of("tmp"), Path::new(dir));
        assert!(volume("tmp").get("emptyDir").is_some());
    }
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_ne!(spec["securityContext"]["runAsUser"], 0);

    // Shutdown: the preStop hook drains with SIGINT (Weir's safe shutdown), and the
    // kubelet's SIGKILL comes only after the hook's delay and the drain have run out.
    let hook = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .expect("preStop exec")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(hook.contains("kill -INT 1"), "preStop: {hook}");
    assert!(
        hook.contains(&format!("sleep {};", expect.pre_stop_delay)),
        "{hook}"
    );
    assert!(
        hook.contains(&format!("-lt {} ]", expect.drain_timeout)),
        "{hook}"
    );
    let grace = num(&spec["terminationGracePeriodSeconds"]);
    assert!(
        grace > expect.pre_stop_delay + expect.drain_timeout,
        "grace period {grace} s must exceed preStop delay {} s + drain {} s",
        expect.pre_stop_delay,
        expect.drain_timeout
    );

    // The Service sends clients to listen_port of these pods.
    let labels = &pod["metadata"]["labels"];
    assert!(selects(&deploy["spec"]["selector"]["matchLabels"], labels));
    let svc = one(objects, "Service");
    assert!(
        selects(&svc["spec"]["selector"], labels),
        "Service selects the pods"
    );
    let svc_ports = svc["spec"]["ports"].as_array().expect("service ports");
    let pg = svc_ports
        .iter()
        .find(|p| p["name"] == "postgres")
        .expect("postgres port");
    assert_eq!(resolve(&pg["targetPort"]), listen_port);
    if let Some(p) = svc_ports.iter().find(|p| p["name"] == "http") {
        assert_eq!(resolve(&p["targetPort"]), http_port);
    }
    if let Some(pdb) = find(objects, "PodDisruptionBudget") {
        assert!(selects(&pdb["spec"]["selector"]["matchLabels"], labels));
    }
    config
}

#[test]
fn chart_lints() {
    let Some(helm) = helm() else { return };
    for extra in [
        &[][..],
        &["--set", "autoscaling.enabled=true,antiAffinity=hard"],
        &["--set", "grafanaDashboard.enabled=true"],
    ] {
        let out = Command::new(&helm)
            .args([
                "lint",
                "--strict",
                "--namespace",
                "pool",
                "--kube-version",
                KUBE_VERSION,
            ])
            .arg(chart_dir())
            .args(extra)
            .output()
            .expect("run helm lint");
        assert!(
            out.status.success(),
            "helm lint {extra:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn defaults_render_a_consistent_pooler() {
    let Some(helm) = helm() else { return };
    let objects = render(&helm, &[]);
    let expected: BTreeSet<String> = [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds(&objects), expected, "HPA off by default");
    let config = check(&objects, &Expect::defaults());
    assert_eq!(config.general.listen_port, 6432);
    assert_eq!(config.general.pool_mode, weir_config::PoolMode::Transaction);
    assert!(config.database("appdb").is_some());

    let deploy = one(&objects, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 3);
    let spec = &deploy["spec"]["template"]["spec"];
    let spread = spec["topologySpreadConstraints"]
        .as_array()
        .expect("spread");
    assert!(spread
        .iter()
        .any(|t| t["topologyKey"] == "topology.kubernetes.io/zone"));
    let anti =
        &spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        anti[0]["podAffinityTerm"]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    assert_eq!(
        one(&objects, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        1
    );
}

/// grafanaDashboard.enabled: a ConfigMap that Grafana's dashboard sidecar picks up,
/// holding deploy/grafana/weir.json as it is (the chart's copy must not drift from it).
#[test]
fn grafana_dashboard_ships_as_a_configmap() {
    let Some(helm) = helm() else { return };
    let labelled = |objects: &[Value]| -> Vec<Value> {
        objects
            .iter()
            .filter(|o| {
                o["kind"] == "ConfigMap" && o["metadata"]["labels"]["grafana_dashboard"] == "1"
            })
            .cloned()
            .collect()
    };
    assert!(labelled(&render(&helm, &[])).is_empty(), "off by default");

    let objects = render(
        &helm,
        &[
            "--set",
            "grafanaDashboard.enabled=true,grafanaDashboard.namespace=monitoring",
            "--set",
            "grafanaDashboard.annotations.grafana_folder=Databases",
        ],
    );
    let found = labelled(&objects);
    assert_eq!(found.len(), 1, "{objects:#?}");
    let cm = &found[0];
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "Databases");
    let want = std::fs::read_to_string(repo_root().join("deploy/grafana/weir.json"))
        .expect("deploy/grafana/weir.json");
    assert!(
        cm["data"]["weir.json"].as_str() == Some(want.as_str()),
        "the ConfigMap's weir.json differs from deploy/grafana/weir.json: copy it to \
         deploy/helm/weir/dashboards/weir.json"
    );
    // Beside it, the rest of the release is as without it.
    let rest: Vec<Value> = objects.iter().filter(|o| *o != cm).cloned().collect();
    check(&rest, &Expect::defaults());
}

/// Other ports, a longer drain, options from a values file (where YAML numbers reach the
/// templates as floats) and the optional pieces: everything still lines up.
#[test]
fn changed_values_follow_through() {
    let Some(helm) = helm() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        r#"
listenPort: 7432
httpPort: 9187
drainTimeoutSeconds: 120
preStopDelaySeconds: 3
databases:
  orders: "host=pg-orders port=5433 dbname=orders"
  "*": "host=pg-rest"
pgbouncer:
  auth_type: md5
  pool_mode: session
  max_client_conn: 1000000
  log_connections: false
  server_check_delay: 2.5
users:
  batch: "pool_mode=transaction"
auth:
  userlist: |
    "admin" "md5a00000000000000000000000000000"
  users:
    - name: 'we"ird'
      password: 'pa"ss'
service:
  metrics:
    enabled: true
"#,
    )
    .expect("write values");
    let values = values.to_str().expect("utf-8 path");
    let objects = render(&helm, &["-f", values]);
    let config = check(
        &objects,
        &Expect {
            drain_timeout: 120,
            pre_stop_delay: 3,
        },
    );
    let g = &config.general;
    assert_eq!(g.listen_port, 7432);
    assert_eq!(g.http_listen.as_deref(), Some("0.0.0.0:9187"));
    assert_eq!(g.max_client_conn, 1_000_000, "no 1e+06 in the ini");
    assert!(!g.log_connections);
    assert_eq!(g.server_check_delay, std::time::Duration::from_millis(2500));
    assert!(config.database("orders").is_some() && config.fallback_database.is_some());
    assert!(config.users.contains_key("batch"));
    let spec = &one(&objects, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(spec["terminationGracePeriodSeconds"], 133);

    let secret = one(&objects, "Secret");
    let text = secret["stringData"]["userlist.txt"]
        .as_str()
        .expect("userlist");
    let users = weir_config::parse_auth_file(text, Path::new("userlist.txt")).users;
    assert_eq!(users.get("we\"ird").map(String::as_str), Some("pa\"ss"));
    assert!(users.contains_key("admin"));
}

#[test]
fn existing_secret_and_autoscaling() {
    let Some(helm) = helm() else { return };
    let objects = render(
        &helm,
        &[
            "--set",
            "auth.existingSecret=pool-users,auth.secretKey=users.txt,autoscaling.enabled=true",
            "--set",
            "terminationGracePeriodSeconds=60,podDisruptionBudget.enabled=false",
        ],
    );
    assert!(
        find(&objects, "Secret").is_none(),
        "no Secret of the chart's own"
    );
    assert!(find(&objects, "PodDisruptionBudget").is_none());
    let config = check(&objects, &Expect::defaults());
    assert_eq!(
        config.general.auth_file.as_deref(),
        Some(Path::new("/etc/weir/auth/users.txt"))
    );
    let deploy = one(&objects, "Deployment");
    assert!(
        deploy["spec"].get("replicas").is_none(),
        "the HPA owns replicas"
    );
    let spec = &deploy["spec"]["template"]["spec"];
    assert_eq!(spec["terminationGracePeriodSeconds"], 60);
    let auth = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "auth")
        .expect("auth volume");
    assert_eq!(auth["secret"]["secretName"], "pool-users");
    let hpa = one(&objects, "HorizontalPodAutoscaler");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deploy["metadata"]["name"]
    );
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
}

/// Values that would break the pooler are refused at render time, not at 3 a.m.
#[test]
fn inconsistent_values_are_refused() {
    let Some(helm) = helm() else { return };
    for (set, says) in [
        (
            "terminationGracePeriodSeconds=30",
            "terminationGracePeriodSeconds",
        ),
        (
            "drainTimeoutSeconds=300,terminationGracePeriodSeconds=120",
            "terminationGracePeriodSeconds",
        ),
        ("pgbouncer.listen_port=7000", "listen_port"),
        ("pgbouncer.http_listen=0.0.0.0:1", "http_listen"),
        ("antiAffinity=sometimes", "antiAffinity"),
    ] {
        match template(&helm, &["--set", set]) {
            Ok(_) => panic!("--set {set} rendered"),
            Err(e) => assert!(e.contains(says), "--set {set}: {e}"),
        }
    }
}

/// The image recipe exposes the chart's default ports and starts Weir with the config
/// path the chart mounts.
#[test]
fn dockerfile_matches_the_chart() {
    let dockerfile =
        std::fs::read_to_string(repo_root().join("deploy/docker/Dockerfile")).expect("Dockerfile");
    let values = chart_values();
    let exposed: BTreeSet<u64> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(|l| {
            l.split_whitespace()
                .map(|p| p.parse().expect("EXPOSE port"))
        })
        .collect();
    let chart_ports = BTreeSet::from([num(&values["listenPort"]), num(&values["httpPort"])]);
    assert_eq!(exposed, chart_ports);
    let helpers =
        std::fs::read_to_string(chart_dir().join("templates/_helpers.tpl")).expect("helpers");
    let path = "/etc/weir/config/pgbouncer.ini";
    assert!(
        helpers.contains(&format!("-}}}}{path}{{{{")),
        "chart's config path"
    );
    assert!(dockerfile.contains(&format!("CMD [\"{path}\"]")));
    assert!(dockerfile.contains("USER 10001"));
    assert_eq!(values["podSecurityContext"]["runAsUser"], 10001);
}

fn chart_values() -> Value {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values.yaml");
    serde_yaml_ng::from_str(&text).expect("values.yaml is YAML")
}

/// Dotted paths of values.yaml's leaves (a list or an empty map is a leaf).
fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, child) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(child, &path, out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

/// The chart's README documents every value: each leaf, or a map holding it, is named in
/// it as `path` or `path.*`. And every `.Values.x.y` the templates read is in values.yaml.
#[test]
fn every_value_is_documented_and_defined() {
    let values = chart_values();
    let readme = std::fs::read_to_string(chart_dir().join("README.md")).expect("README.md");
    let mut paths = Vec::new();
    leaves(&values, "", &mut paths);
    let documented = |path: &str| {
        let parts: Vec<&str> = path.split('.').collect();
        (1..=parts.len()).any(|n| {
            let p = parts[..n].join(".");
            readme.contains(&format!("`{p}`")) || readme.contains(&format!("`{p}.*`"))
        })
    };
    let missing: Vec<&String> = paths.iter().filter(|p| !documented(p)).collect();
    assert!(
        missing.is_empty(),
        "values not in the chart's README: {missing:?}"
    );

    let templates = chart_dir().join("templates");
    for entry in std::fs::read_dir(&templates).expect("templates") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("template");
        for (at, _) in text.match_indices(".Values.") {
            let rest = &text[at + ".Values.".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .unwrap_or(rest.len());
            let used = rest[..end].trim_end_matches('.');
            let found = used.split('.').try_fold(&values, |v, k| v.get(k)).is_some();
            assert!(
                found,
                "{}: .Values.{used} is not in values.yaml",
                path.display()
            );
        }
    }
}
