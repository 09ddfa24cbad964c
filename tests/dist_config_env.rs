//! The configuration is read through psenv: values given to `MXInitPSEnv`
//! come before the process environment (own test binary: it sets
//! process-wide state).

use mxkv::dist::config::Config;
use mxkv::dist::message::Role;
use std::time::Duration;

#[test]
fn dist_config_from_mxinitpsenv_values() {
    if std::env::var_os("DMLC_PS_ROOT_URI").is_none() {
        let e = Config::from_env().unwrap_err();
        assert!(e.message().contains("DMLC_PS_ROOT_URI"), "{e}");
    }
    mxkv::psenv::set_vars(
        [
            ("DMLC_ROLE", "server"),
            ("DMLC_PS_ROOT_URI", "10.0.0.1"),
            ("DMLC_PS_ROOT_PORT", "9091"),
            ("DMLC_NUM_WORKER", "4"),
            ("DMLC_NUM_SERVER", "2"),
            ("MXKV_TIMEOUT_S", "7"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let c = Config::from_env().unwrap();
    assert_eq!(c.role, Role::Server);
    assert_eq!((c.root_uri.as_str(), c.root_port), ("10.0.0.1", 9091));
    assert_eq!((c.num_worker, c.num_server), (4, 2));
    assert_eq!(c.timeout, Duration::from_secs(7));
}
