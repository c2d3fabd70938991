use super::keys;
use super::*;
use crate::secret::tests::{FOO_SALT32, PG_FOO, PG_PENCIL};
use crate::{b64, scram_secret, AuthError, ScramSecret, Secret};

// RFC 7677 section 3
const RFC_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const RFC_SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
const RFC_C1: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const RFC_S1: &str =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const RFC_C2: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const RFC_S2: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_secret() -> ScramSecret {
    scram_secret("pencil", &b64::decode(RFC_SALT.as_bytes()).unwrap(), 4096)
}

fn parse_scram(text: &str) -> ScramSecret {
    match Secret::parse(text) {
        Secret::Scram(s) => s,
        other => panic!("not SCRAM: {other:?}"),
    }
}

/// Runs a full exchange and returns the server's outcome.
fn exchange(
    client: &mut ClientSession,
    server: &mut ServerSession,
) -> Result<ServerFinal, AuthError> {
    let first = client.client_first();
    let server_first = server.client_first(&first)?;
    let client_final = client.server_first(&server_first)?;
    let outcome = server.client_final(&client_final)?;
    client.server_final(&outcome.message)?;
    Ok(outcome)
}

fn password(p: &str) -> ClientSession {
    ClientSession::new(Credential::Password(p.into()))
}

fn server(secret: &str) -> ServerSession {
    ServerSession::new(&Secret::parse(secret)).unwrap()
}

#[test]
fn rfc7677_client() {
    let mut client = ClientSession::with_nonce(
        Credential::Password("pencil".into()),
        "user",
        RFC_CLIENT_NONCE.into(),
    );
    assert_eq!(client.client_first(), RFC_C1.as_bytes());
    assert_eq!(
        client.server_first(RFC_S1.as_bytes()).unwrap(),
        RFC_C2.as_bytes()
    );
    client.server_final(RFC_S2.as_bytes()).unwrap();
}

#[test]
fn rfc7677_client_with_keys() {
    let salted = keys::salted_password(b"pencil", &b64::decode(RFC_SALT.as_bytes()).unwrap(), 4096);
    let credential = Credential::Keys {
        client_key: keys::client_key(&salted),
        server_key: keys::server_key(&salted),
    };
    let mut client = ClientSession::with_nonce(credential, "user", RFC_CLIENT_NONCE.into());
    client.client_first();
    assert_eq!(
        client.server_first(RFC_S1.as_bytes()).unwrap(),
        RFC_C2.as_bytes()
    );
    client.server_final(RFC_S2.as_bytes()).unwrap();
}

#[test]
fn rfc7677_server() {
    let secret = rfc_secret();
    let mut server = ServerSession::with_nonce(secret.clone(), RFC_SERVER_NONCE);
    assert_eq!(
        server.client_first(RFC_C1.as_bytes()).unwrap(),
        RFC_S1.as_bytes()
    );
    let outcome = server.client_final(RFC_C2.as_bytes()).unwrap();
    assert_eq!(outcome.message, RFC_S2.as_bytes());
    assert_eq!(keys::sha256(&outcome.client_key), secret.stored_key);
    assert_eq!(outcome.server_key, secret.server_key);
}

#[test]
fn round_trip_with_postgres_verifiers() {
    for (secret, pw) in [(PG_FOO, "foo"), (PG_PENCIL, "pencil"), (FOO_SALT32, "foo")] {
        exchange(&mut password(pw), &mut server(secret)).unwrap();
    }
}

#[test]
fn round_trip_with_plain_secret() {
    let secret = Secret::Plain("hunter2".into());
    exchange(
        &mut password("hunter2"),
        &mut ServerSession::new(&secret).unwrap(),
    )
    .unwrap();
    let err = exchange(
        &mut password("hunter3"),
        &mut ServerSession::new(&secret).unwrap(),
    )
    .unwrap_err();
    assert_eq!(err, AuthError::WrongPassword);
}

#[test]
fn md5_secret_cannot_do_scram() {
    assert!(ServerSession::new(&Secret::parse("md53175bce1d3201d16594cebf9d7eb3f9d")).is_none());
}

#[test]
fn recovered_keys_log_in_without_the_password() {
    let outcome = exchange(&mut password("foo"), &mut server(PG_FOO)).unwrap();
    let keys = Credential::Keys {
        client_key: outcome.client_key,
        server_key: outcome.server_key,
    };
    exchange(&mut ClientSession::new(keys.clone()), &mut server(PG_FOO)).unwrap();
    // A verifier with another salt yields other keys.
    let err = exchange(&mut ClientSession::new(keys), &mut server(FOO_SALT32)).unwrap_err();
    assert_eq!(err, AuthError::WrongPassword);
}

#[test]
fn wrong_password_fails() {
    let mut client = password("bar");
    let mut server = server(PG_FOO);
    let server_first = server.client_first(&client.client_first()).unwrap();
    let client_final = client.server_first(&server_first).unwrap();
    assert_eq!(
        server.client_final(&client_final).unwrap_err(),
        AuthError::WrongPassword
    );
    // the session is spent
    assert_eq!(
        server.client_final(&client_final).unwrap_err(),
        AuthError::OutOfOrder
    );
}

#[test]
fn server_with_wrong_verifier_is_caught_by_client() {
    // The server knows StoredKey (so it accepts us) but not ServerKey.
    let mut forged = parse_scram(PG_FOO);
    forged.server_key = [7; 32];
    let mut client = password("foo");
    let mut server = ServerSession::from_scram(forged);
    let server_first = server.client_first(&client.client_first()).unwrap();
    let outcome = server
        .client_final(&client.server_first(&server_first).unwrap())
        .unwrap();
    assert_eq!(
        client.server_final(&outcome.message).unwrap_err(),
        AuthError::InvalidServerSignature
    );
}

#[test]
fn tampered_nonce_fails() {
    let mut client = password("foo");
    let mut server = server(PG_FOO);
    let server_first = server.client_first(&client.client_first()).unwrap();
    let client_final = String::from_utf8(client.server_first(&server_first).unwrap()).unwrap();
    let tampered = client_final.replacen(",r=", ",r=X", 1);
    assert_eq!(
        server.client_final(tampered.as_bytes()).unwrap_err(),
        AuthError::NonceMismatch
    );

    // server-first whose nonce does not extend ours
    let mut client = password("foo");
    client.client_first();
    let err = client
        .server_first(b"r=someoneelse,s=c2FsdA==,i=4096")
        .unwrap_err();
    assert_eq!(err, AuthError::NonceMismatch);
}

#[test]
fn client_first_format() {
    let first = String::from_utf8(password("x").client_first()).unwrap();
    let nonce = first.strip_prefix("n,,n=,r=").unwrap();
    assert_eq!(nonce.len(), 24);
    assert!(super::messages::is_printable(nonce.as_bytes()));
    assert_ne!(password("x").client_first(), password("x").client_first());
}

/// SCRAM-SHA-256-PLUS: with binding data the server checks c= against the gs2 header
/// and the data; a 'y' client is a downgrade once PLUS is offered.
#[test]
fn channel_binding_tls_server_end_point() {
    let secret = rfc_secret();
    let data = b"0123456789abcdef0123456789abcdef".to_vec();
    let bound = || ServerSession::from_scram(secret.clone()).with_channel_binding(data.clone());
    assert!(bound()
        .client_first(b"p=tls-server-end-point,,n=,r=abc")
        .is_ok());
    assert!(bound().client_first(b"n,,n=,r=abc").is_ok());
    assert_eq!(
        bound().client_first(b"y,,n=,r=abc"),
        Err(AuthError::ChannelBindingDowngrade)
    );
    assert_eq!(
        bound().client_first(b"p=tls-unique,,n=,r=abc"),
        Err(AuthError::UnsupportedChannelBinding)
    );
    // c= must carry the data: base64 of the gs2 header and the data.
    let mut s = bound();
    let first = s
        .client_first(b"p=tls-server-end-point,,n=,r=abc")
        .expect("first");
    let nonce =
        String::from_utf8(first[2..first.iter().position(|&b| b == b',').unwrap()].to_vec())
            .unwrap();
    let mut wrong = b"p=tls-server-end-point,,".to_vec();
    wrong.extend_from_slice(b"not the server's data");
    let msg = format!("c={},r={nonce},p=AAAA", crate::b64::encode(&wrong));
    assert!(matches!(
        s.client_final(msg.as_bytes()),
        Err(AuthError::Malformed(_))
    ));
}

#[test]
fn gs2_headers() {
    let secret = rfc_secret();
    let first =
        |data: &str| ServerSession::from_scram(secret.clone()).client_first(data.as_bytes());
    assert!(first("n,,n=,r=abc").is_ok());
    assert!(first("y,,n=,r=abc").is_ok());
    assert!(first("n,,n=user,r=abc,x=ext,y=").is_ok());
    assert_eq!(
        first("p=tls-server-end-point,,n=,r=abc"),
        Err(AuthError::UnsupportedChannelBinding)
    );
    assert_eq!(
        first("n,a=admin,n=,r=abc"),
        Err(AuthError::UnsupportedAuthzid)
    );
    assert_eq!(
        first("n,,m=ext,n=,r=abc"),
        Err(AuthError::UnsupportedExtension)
    );
    for bad in [
        "",
        "n",
        "n,",
        "n,,",
        "x,,n=,r=abc",
        "n;,n=,r=abc",
        "n,x,n=,r=abc",
        "n,,r=abc",
        "n,,n=,r=",
        "n,,n=,r=a b",
        "n,,n=,r=abc,1=x",
        "n,,n=\0,r=abc",
        "n,,n=,x=abc",
    ] {
        assert!(
            matches!(first(bad), Err(AuthError::Malformed(_))),
            "{bad:?}: {:?}",
            first(bad)
        );
    }
}

/// Drives a server session through client-first with `gs2`, then computes a
/// correct proof for `without_proof` (which must carry the session nonce where
/// `{nonce}` appears) so individual client-final fields can be varied.
fn client_final_with(gs2: &str, without_proof: &str) -> Result<ServerFinal, AuthError> {
    let secret = rfc_secret();
    let mut server = ServerSession::with_nonce(secret, RFC_SERVER_NONCE);
    let bare = "n=,r=abc";
    let server_first = server
        .client_first(format!("{gs2}{bare}").as_bytes())
        .unwrap();
    let without_proof = without_proof.replace("{nonce}", &format!("abc{RFC_SERVER_NONCE}"));
    let salted = keys::salted_password(b"pencil", &b64::decode(RFC_SALT.as_bytes()).unwrap(), 4096);
    let client_key = keys::client_key(&salted);
    let auth = keys::auth_message_parts(bare.as_bytes(), &server_first, without_proof.as_bytes());
    let proof = keys::xor(&client_key, &keys::hmac(&keys::sha256(&client_key), &auth));
    server.client_final(format!("{without_proof},p={}", b64::encode(&proof)).as_bytes())
}

#[test]
fn channel_binding_must_match_gs2_header() {
    assert!(client_final_with("n,,", "c=biws,r={nonce}").is_ok());
    assert!(client_final_with("y,,", "c=eSws,r={nonce}").is_ok());
    assert!(matches!(
        client_final_with("y,,", "c=biws,r={nonce}"),
        Err(AuthError::Malformed(_))
    ));
    assert!(matches!(
        client_final_with("n,,", "c=eSws,r={nonce}"),
        Err(AuthError::Malformed(_))
    ));
}

#[test]
fn client_final_extensions_are_covered_by_the_proof() {
    assert!(client_final_with("n,,", "c=biws,r={nonce},x=something").is_ok());
}

#[test]
fn malformed_client_final() {
    let secret = rfc_secret();
    for bad in [
        "",
        "c=biws",
        "r=x,c=biws,p=AAAA",
        &RFC_C2.replace("p=", "q="),
        &format!("{RFC_C2},x=1"),
        &RFC_C2.replace("p=dHzb", "p=dHz"),
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA",
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=!!!",
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,9=x,p=AAAA",
    ] {
        let mut server = ServerSession::with_nonce(secret.clone(), RFC_SERVER_NONCE);
        server.client_first(RFC_C1.as_bytes()).unwrap();
        assert!(
            matches!(
                server.client_final(bad.as_bytes()),
                Err(AuthError::Malformed(_))
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn malformed_server_first() {
    for (bad, expected) in [
        (
            "",
            AuthError::Malformed("nonce expected in server-first-message"),
        ),
        (
            "r=NONCEx",
            AuthError::Malformed("salt expected in server-first-message"),
        ),
        ("r=NONCEx,s=!!,i=4096", AuthError::Malformed("invalid salt")),
        (
            "r=NONCEx,s=c2FsdA==",
            AuthError::Malformed("iteration count expected in server-first-message"),
        ),
        ("r=NONCEx,s=c2FsdA==,i=0", AuthError::InvalidIterationCount),
        ("r=NONCEx,s=c2FsdA==,i=-1", AuthError::InvalidIterationCount),
        (
            "r=NONCEx,s=c2FsdA==,i=10000001",
            AuthError::InvalidIterationCount,
        ),
        (
            "r=NONCEx,s=c2FsdA==,i=99999999999999999999",
            AuthError::InvalidIterationCount,
        ),
        ("r=NONCEx,s=c2FsdA==,i=4k", AuthError::InvalidIterationCount),
        ("r=NONCEx,s=c2FsdA==,i=", AuthError::InvalidIterationCount),
        (
            "r=NONCEx,s=c2FsdA==,i=1,x=y",
            AuthError::Malformed("garbage at end of server-first-message"),
        ),
        ("r=NONC,s=c2FsdA==,i=1", AuthError::NonceMismatch),
    ] {
        let mut client =
            ClientSession::with_nonce(Credential::Password("x".into()), "", "NONCE".into());
        client.client_first();
        assert_eq!(
            client.server_first(bad.as_bytes()),
            Err(expected),
            "{bad:?}"
        );
    }
}

#[test]
fn server_final_outcomes() {
    let run = |final_message: &[u8]| {
        let mut client = ClientSession::with_nonce(
            Credential::Password("pencil".into()),
            "user",
            RFC_CLIENT_NONCE.into(),
        );
        client.client_first();
        client.server_first(RFC_S1.as_bytes()).unwrap();
        client.server_final(final_message)
    };
    assert_eq!(run(RFC_S2.as_bytes()), Ok(()));
    assert_eq!(
        run(b"e=invalid-proof"),
        Err(AuthError::ServerError("invalid-proof".into()))
    );
    assert_eq!(
        run(b"v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
        Err(AuthError::InvalidServerSignature)
    );
    assert_eq!(
        run(b"v=AAAA"),
        Err(AuthError::Malformed("malformed server signature"))
    );
    assert_eq!(
        run(b""),
        Err(AuthError::Malformed(
            "verifier expected in server-final-message"
        ))
    );
    assert_eq!(
        run(format!("{RFC_S2},x=1").as_bytes()),
        Err(AuthError::Malformed(
            "garbage at end of server-final-message"
        ))
    );
}

#[test]
fn steps_out_of_order() {
    let mut client = password("x");
    assert_eq!(
        client.server_first(b"r=x,s=,i=1"),
        Err(AuthError::OutOfOrder)
    );
    assert_eq!(
        client.server_final(RFC_S2.as_bytes()),
        Err(AuthError::OutOfOrder)
    );
    // any error, misuse included, spends the session
    assert!(matches!(
        server(PG_FOO).client_final(RFC_C2.as_bytes()),
        Err(AuthError::OutOfOrder)
    ));
    let mut server = server(PG_FOO);
    server.client_first(RFC_C1.as_bytes()).unwrap();
    assert_eq!(
        server.client_first(RFC_C1.as_bytes()),
        Err(AuthError::OutOfOrder)
    );
}

/// Every truncation and single-byte corruption of a valid exchange must
/// produce an error or success, never a panic.
#[test]
fn mangled_messages_never_panic() {
    let secret = rfc_secret();
    let replacements = [0u8, b',', b'=', b'p', b'r', 0xff];
    let mutations = |msg: &str| {
        let msg = msg.as_bytes().to_vec();
        let mut out: Vec<Vec<u8>> = (0..=msg.len()).map(|n| msg[..n].to_vec()).collect();
        for i in 0..msg.len() {
            for r in replacements {
                let mut m = msg.clone();
                m[i] = r;
                out.push(m);
            }
        }
        out
    };
    for m in mutations(RFC_C1) {
        let _ = ServerSession::with_nonce(secret.clone(), RFC_SERVER_NONCE).client_first(&m);
    }
    for m in mutations(RFC_C2) {
        let mut server = ServerSession::with_nonce(secret.clone(), RFC_SERVER_NONCE);
        server.client_first(RFC_C1.as_bytes()).unwrap();
        let _ = server.client_final(&m);
    }
    // server-first with a cheap iteration count so the loop stays fast
    let cheap_s1 = RFC_S1.replace("i=4096", "i=1");
    for m in mutations(&cheap_s1) {
        let mut client = ClientSession::with_nonce(
            Credential::Password("pencil".into()),
            "user",
            RFC_CLIENT_NONCE.into(),
        );
        client.client_first();
        let _ = client.server_first(&m);
    }
    // keys rather than a password: no PBKDF2 per iteration
    let salted = keys::salted_password(b"pencil", &secret.salt, 4096);
    let credential = Credential::Keys {
        client_key: keys::client_key(&salted),
        server_key: keys::server_key(&salted),
    };
    for m in mutations(RFC_S2) {
        let mut client =
            ClientSession::with_nonce(credential.clone(), "user", RFC_CLIENT_NONCE.into());
        client.client_first();
        client.server_first(RFC_S1.as_bytes()).unwrap();
        let _ = client.server_final(&m);
    }
}

/// The client side of SCRAM-SHA-256-PLUS: the gs2 header names tls-server-end-point and
/// c= carries the server's certificate hash, so a server holding the same hash accepts
/// the proof and one seeing another certificate (a man in the middle) refuses it.
#[test]
fn client_binds_to_the_server_end_point() {
    let data = b"0123456789abcdef0123456789abcdef".to_vec();
    let bound_client = || password("pencil").with_binding(Binding::EndPoint(data.clone()));
    assert_eq!(bound_client().mechanism(), MECHANISM_PLUS);
    let first = bound_client().client_first();
    assert!(first.starts_with(b"p=tls-server-end-point,,n=,r="));
    let bound_server = || server(PG_PENCIL).with_channel_binding(data.clone());
    exchange(&mut bound_client(), &mut bound_server()).expect("same end point");
    let other = server(PG_PENCIL).with_channel_binding(b"another certificate's hash".to_vec());
    assert!(exchange(&mut bound_client(), &mut { other }).is_err());
    // c= is base64 of the header and the data.
    let mut c = bound_client();
    let mut s = bound_server();
    let server_first = s.client_first(&c.client_first()).expect("first");
    let fin = String::from_utf8(c.server_first(&server_first).expect("final")).unwrap();
    let mut input = b"p=tls-server-end-point,,".to_vec();
    input.extend_from_slice(&data);
    assert!(
        fin.starts_with(&format!("c={},", b64::encode(&input))),
        "{fin}"
    );
}

/// In TLS towards a server that offers no PLUS, the client says "y": it could bind.
/// A server that did offer PLUS takes that as a downgrade.
#[test]
fn client_says_y_when_plus_is_not_offered() {
    let mut c = password("pencil").with_binding(Binding::Unused);
    assert_eq!(c.mechanism(), MECHANISM);
    assert!(c.client_first().starts_with(b"y,,n=,r="));
    exchange(
        &mut password("pencil").with_binding(Binding::Unused),
        &mut server(PG_PENCIL),
    )
    .expect("plain server");
    let plus = server(PG_PENCIL).with_channel_binding(b"x".to_vec());
    assert_eq!(
        exchange(
            &mut password("pencil").with_binding(Binding::Unused),
            &mut { plus }
        )
        .err(),
        Some(AuthError::ChannelBindingDowngrade)
    );
}

#[test]
fn mock_and_plain_salts_are_fixed_per_user() {
    use super::server::mock_secret;
    let a = mock_secret("nobody");
    assert_eq!(a.salt, mock_secret("nobody").salt);
    assert_ne!(a.salt, mock_secret("other").salt);
    assert_eq!(a.salt.len(), 16);
    // A real user with a plaintext password gets a salt of the same kind, the same on
    // every login, and a verifier that checks the password.
    let secret = Secret::Plain("pencil".into());
    let first = ServerSession::for_user("alice", &secret).unwrap();
    let second = ServerSession::for_user("alice", &secret).unwrap();
    assert_eq!(first.salt(), second.salt());
    assert_eq!(first.salt().len(), 16);
    // What a user would be challenged with if it were deleted: the same salt.
    assert_eq!(first.salt(), mock_secret("alice").salt.as_slice());
}
