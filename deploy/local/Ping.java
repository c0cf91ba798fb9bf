// A real client round trip against the local broker: describe the cluster and list topics.
// Run by kafka.sh with Java's single-file source launcher; exits 0 only when the broker answers.
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;

public class Ping {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "3000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "5000");
        try (Admin admin = Admin.create(props)) {
            int nodes = admin.describeCluster().nodes().get(5, TimeUnit.SECONDS).size();
            admin.listTopics().names().get(5, TimeUnit.SECONDS);
            if (nodes < 1) {
                System.exit(1);
            }
        } catch (Exception e) {
            System.err.println("ping failed: " + e);
            System.exit(1);
        }
    }
}
