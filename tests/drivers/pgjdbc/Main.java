// pgJDBC at its default settings (prepareThreshold=5: from the fifth execution a
// PreparedStatement is a named server statement S_n) through Weir in transaction mode, with
// Weir's default configuration.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.TimeUnit;

public class Main {
    static void check(boolean cond, String what) {
        if (!cond) throw new AssertionError("FAILED: " + what);
    }

    static void client(int i, CyclicBarrier meet) throws Exception {
        String app = "drv-pgjdbc-" + i;
        String url = "jdbc:postgresql://" + System.getenv("WEIR_HOST") + ":" + System.getenv("WEIR_PORT") + "/"
                + System.getenv("WEIR_DB");
        Properties props = new Properties();
        props.setProperty("user", System.getenv("WEIR_USER"));
        props.setProperty("ApplicationName", app);
        try (Connection c = DriverManager.getConnection(url, props)) {
            // pgJDBC 42.7.5 and later send no extra_float_digits to PostgreSQL 12 or later
            // (42.7.4 sent extra_float_digits=3 in its startup packet); its application_name
            // comes as a SET after the login, no longer in the startup packet either.
            try (Statement st = c.createStatement();
                 ResultSet rs = st.executeQuery("select source from pg_settings where name = 'extra_float_digits'")) {
                rs.next();
                check("default".equals(rs.getString(1)), "client " + i + ": extra_float_digits was set (" + rs.getString(1) + ")");
            }
            // prepareThreshold=5: the fifth execution of a PreparedStatement and the ones after
            // it use a named statement, which the server holds (under Weir's name through
            // Weir); the first four are unnamed. The text is this client's alone.
            try (PreparedStatement ps = c.prepareStatement(
                    "select count(*) from pg_prepared_statements where statement = ? /* client " + i + " */")) {
                for (int n = 1; n <= 7; n++) {
                    ps.setString(1, "select count(*) from pg_prepared_statements where statement = $1 /* client " + i + " */");
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        check(rs.getInt(1) == (n < 5 ? 0 : 1), "client " + i + ": execution " + n + " sees " + rs.getInt(1) + " named statement(s)");
                    }
                }
            }
            try (PreparedStatement ps = c.prepareStatement("select ?::int + ?::int, current_setting('application_name')")) {
                for (int n = 0; n < 10; n++) {
                    ps.setInt(1, n);
                    ps.setInt(2, i);
                    try (ResultSet rs = ps.executeQuery()) {
                        check(rs.next(), "a row");
                        check(rs.getInt(1) == n + i, "client " + i + ": " + rs.getInt(1) + " != " + (n + i));
                        check(app.equals(rs.getString(2)), "client " + i + ": application_name " + rs.getString(2));
                    }
                    if (n == 3) meet.await(30, TimeUnit.SECONDS);
                }
            }
            // A transaction with an error mid-way, then the connection still works.
            c.setAutoCommit(false);
            try (PreparedStatement ins = c.prepareStatement("insert into drv_pgjdbc (id, v) values (?, ?)");
                 PreparedStatement div = c.prepareStatement("select 1 / (?::int - ?::int)")) {
                ins.setInt(1, 100000 + i);
                ins.setString(2, "lost");
                ins.executeUpdate();
                div.setInt(1, i);
                div.setInt(2, i);
                try {
                    div.executeQuery();
                    check(false, "division by zero was not raised");
                } catch (SQLException e) {
                    check("22012".equals(e.getSQLState()), "client " + i + ": " + e);
                }
                c.rollback();
                // A batch, past the prepare threshold.
                for (int k = 0; k < 20; k++) {
                    ins.setInt(1, i * 1000 + k);
                    ins.setString(2, "b" + k);
                    ins.addBatch();
                }
                ins.executeBatch();
                c.commit();
            }
            c.setAutoCommit(true);
            try (PreparedStatement q = c.prepareStatement("select count(*) from drv_pgjdbc where id / 1000 = ?")) {
                for (int n = 0; n < 7; n++) {
                    q.setInt(1, i);
                    try (ResultSet rs = q.executeQuery()) {
                        rs.next();
                        check(rs.getInt(1) == 20, "client " + i + ": " + rs.getInt(1) + " rows");
                    }
                }
            }
            try (PreparedStatement q = c.prepareStatement("select count(*) from drv_pgjdbc where id = ?")) {
                q.setInt(1, 100000 + i);
                try (ResultSet rs = q.executeQuery()) {
                    rs.next();
                    check(rs.getInt(1) == 0, "client " + i + ": the failed transaction's insert is visible");
                }
            }
            // Session state (SET search_path) follows the client in transaction mode, and
            // no other client on the same server sees it.
            try (Statement st = c.createStatement()) {
                st.execute("set search_path to drv_schema_" + i + ", public");
                ResultSet rs = st.executeQuery("show search_path");
                rs.next();
                check(rs.getString(1).equals("drv_schema_" + i + ", public"), "search_path");
            }
        }
    }

    public static void main(String[] args) throws Exception {
        String env = System.getenv("WEIR_CLIENTS");
        int clients = env == null ? 10 : Integer.parseInt(env);
        CyclicBarrier meet = new CyclicBarrier(clients);
        List<Thread> threads = new ArrayList<>();
        List<String> failed = new ArrayList<>();
        for (int i = 0; i < clients; i++) {
            final int id = i;
            Thread t = new Thread(() -> {
                try {
                    client(id, meet);
                } catch (Throwable e) {
                    synchronized (failed) {
                        failed.add("client " + id + ": " + e);
                    }
                    meet.reset();
                }
            });
            threads.add(t);
            t.start();
        }
        for (Thread t : threads) t.join();
        failed.forEach(System.out::println);
        if (!failed.isEmpty()) {
            System.err.println(failed.size() + " client(s) failed");
            System.exit(1);
        }
        System.out.println("pgJDBC " + org.postgresql.util.DriverInfo.DRIVER_VERSION + ": " + clients + " clients ok");
    }
}
